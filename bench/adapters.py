"""One adapter per system under test: enqueue, bulk enqueue, call, worker command.

Each cell runs in its own process with BENCH_SYSTEM/BENCH_BACKEND/BENCH_DB set,
so the Django systems get a settings module with only their own app installed.
Progress (how many tasks finished, and when) is read with plain SQL on a
separate connection so it costs every system the same.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time

SYSTEM = os.environ["BENCH_SYSTEM"]
BACKEND = os.environ["BENCH_BACKEND"]
DB = os.environ["BENCH_DB"]
PY = sys.executable


def _django():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.project.settings")
    import django

    django.setup()


class Probe:
    """Plain-SQL reads of finished counts and completion times."""

    QUERIES = {
        # Bounded below by the probe's start, so W5's million retained rows
        # (finished before it) stay out of the count: scanning them four times
        # a second cost the drain being measured half its rate on 2 cores.
        "cairnq": (
            "SELECT count(*), min(completed_at_ms) / 1000.0, max(completed_at_ms) / 1000.0"
            " FROM cairnq_tasks WHERE status = 'succeeded' AND name = 'noop'"
            " AND completed_at_ms >= {since_ms}"
        ),
        "django_tasks_db": (
            "SELECT count(*), min(finished_at), max(finished_at)"
            " FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'"
        ),
        "procrastinate": (
            "SELECT count(*), extract(epoch from min(at)), extract(epoch from max(at))"
            " FROM procrastinate_events WHERE type = 'succeeded'"
        ),
    }

    def __init__(self) -> None:
        family = "cairnq" if SYSTEM in ("cairnq_django", "cairnq") else SYSTEM
        # A second of slack for clocks read in different places (Postgres
        # stamps completions with its own clock).
        self.sql = self.QUERIES[family].format(since_ms=int(time.time() * 1000) - 1000)
        if BACKEND == "postgres":
            import psycopg

            self.conn = psycopg.connect(dbname=DB, host="127.0.0.1", user="root", autocommit=True)
        else:
            self.conn = sqlite3.connect(DB, isolation_level=None)

    def done(self) -> tuple[int, float | None, float | None]:
        """Return (finished count, first and last completion as epoch seconds)."""
        row = self.conn.execute(self.sql).fetchone()
        first, last = row[1], row[2]
        if isinstance(first, str):  # django-tasks-db on SQLite stores ISO text
            from datetime import datetime

            first = datetime.fromisoformat(first).timestamp()
            last = datetime.fromisoformat(last).timestamp()
        elif hasattr(first, "timestamp"):
            first, last = first.timestamp(), last.timestamp()
        return int(row[0]), None if first is None else float(first), None if last is None else float(last)


class CairnQDjango:
    label = "cairnq_django"

    def __init__(self) -> None:
        _django()
        import cairnq_django

        self.cq = cairnq_django

    def enqueue(self, seq=None) -> None:
        self.cq.enqueue("noop", {} if seq is None else {"seq": seq})

    def enqueue_bulk(self, n: int) -> None:
        self.cq.enqueue_many([("noop", {})] * n)

    def call(self) -> None:
        self.cq.call("noop", {}, timeout=30)

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "django", "cairnq_worker"]
        return cmd + flags(setting)


class DjangoTasksDB:
    label = "django_tasks_db"

    def __init__(self) -> None:
        _django()
        from django.db import transaction

        from .benchapp.dt_tasks import noop

        self.noop = noop
        self.transaction = transaction

    def enqueue(self, seq=None) -> None:
        self.noop.enqueue(seq=seq)

    def enqueue_bulk(self, n: int) -> None:
        # No bulk API: the fastest a user can do is one transaction around the loop.
        with self.transaction.atomic():
            for _ in range(n):
                self.noop.enqueue()

    def call(self) -> None:
        # No call(): enqueue, then poll the result every 5 ms.
        result = self.noop.enqueue()
        while True:
            result.refresh()
            if result.is_finished:
                return
            time.sleep(0.005)

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "django", "db_worker"]
        return cmd + flags(setting)


class Procrastinate:
    label = "procrastinate"

    def __init__(self) -> None:
        _django()
        from .benchapp.procrastinate_tasks import noop

        self.noop = noop

    def enqueue(self, seq=None) -> None:
        self.noop.defer(seq=seq)

    def enqueue_bulk(self, n: int) -> None:
        for start in range(0, n, 5000):
            self.noop.batch_defer(*({} for _ in range(min(5000, n - start))))

    def call(self) -> None:
        # No call(): defer, then poll the job's status every 5 ms.
        from procrastinate.contrib.django.models import ProcrastinateJob

        job_id = self.noop.defer()
        while ProcrastinateJob.objects.filter(id=job_id, status="succeeded").count() == 0:
            time.sleep(0.005)

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "django", "procrastinate", "worker"]
        return cmd + flags(setting)


class CairnQSDK:
    label = "cairnq"

    def __init__(self) -> None:
        from .cairnq_sdk import client

        self.loop = asyncio.new_event_loop()
        self.client = client(BACKEND, DB)
        self.loop.run_until_complete(self.client.connect())

    def enqueue(self, seq=None) -> None:
        self.loop.run_until_complete(self.client.submit("noop", {} if seq is None else {"seq": seq}))

    def enqueue_bulk(self, n: int) -> None:
        # No bulk API in 0.15.1: sequential submits.
        async def go():
            for _ in range(n):
                await self.client.submit("noop", {})

        self.loop.run_until_complete(go())

    def call(self) -> None:
        self.loop.run_until_complete(self.client.call("noop", {}, timeout_ms=30_000))

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "bench.cairnq_sdk", "worker", "--backend", BACKEND, "--db", DB]
        return cmd + flags(setting)


ADAPTERS = {
    "cairnq_django": CairnQDjango,
    "django_tasks_db": DjangoTasksDB,
    "procrastinate": Procrastinate,
    "cairnq": CairnQSDK,
}


def flags(setting: str | None) -> list[str]:
    """The command-line part of a tuning setting (KEY=value words are settings)."""
    return [w for w in (setting or "").split() if "=" not in w]


def setting_env(setting: str | None) -> dict[str, str]:
    """The settings part of a tuning setting, as BENCH_KEY environment variables."""
    return {
        f"BENCH_{k}": v for k, v in (w.split("=", 1) for w in (setting or "").split() if "=" in w)
    }


def get_adapter():
    return ADAPTERS[SYSTEM]()
