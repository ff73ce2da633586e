"""One adapter per system under test: enqueue, bulk enqueue, call, worker command.

Each cell runs in its own process with BENCH_SYSTEM/BENCH_BACKEND/BENCH_DB set,
so the Django systems get a settings module with only their own app installed.
Progress (how many tasks finished, and when) is read with plain SQL on a
separate connection so it costs every system the same.
"""

from __future__ import annotations

import asyncio
import datetime as dt
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


# Peers that keep no durable row of a finished task: their handlers append
# the time they finished to a file (benchapp/stamp.py), read by DoneFile.
FILE_PROBED = {"celery", "pgqueuer", "huey", "django_q2"}
# Peers whose queue is not in the cell's database (Celery's is Redis): the
# database's transaction and session counts say nothing about them.
OFF_DATABASE = {"celery"}


class DoneFile:
    """The drain's progress from the BENCH_DONE file the handlers append to."""

    def __init__(self) -> None:
        self.path = os.environ["BENCH_DONE"]
        self.f = open(self.path)
        self.times: list[float] = []
        self.buf = ""

    def done(self) -> tuple[int, float | None, float | None]:
        self.buf += self.f.read()
        *lines, self.buf = self.buf.split("\n")
        self.times.extend(float(line) for line in lines if line)
        if not self.times:
            return 0, None, None
        return len(self.times), min(self.times), max(self.times)


def _done_file() -> None:
    """Point this cell's handlers (the worker inherits the environment) at an empty file."""
    path = os.path.join(os.environ.get("BENCH_LOG_DIR", "/tmp"), f"done-{SYSTEM}-{BACKEND}-{os.getpid()}.txt")
    open(path, "w").close()
    os.environ["BENCH_DONE"] = path


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
        if SYSTEM in FILE_PROBED:
            self.file = DoneFile()
            return
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
        if SYSTEM in FILE_PROBED:
            return self.file.done()
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

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        self.cq.enqueue("noop", {"seq": seq}, delay=dt.timedelta(seconds=delay_s))

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

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        from django.utils import timezone

        run_after = timezone.now() + dt.timedelta(seconds=delay_s)
        self.noop.using(run_after=run_after).enqueue(seq=seq)

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

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        self.noop.configure(schedule_in={"seconds": delay_s}).defer(seq=seq)

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

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        submit = self.client.submit("noop", {"seq": seq}, delay_ms=int(delay_s * 1000))
        self.loop.run_until_complete(submit)

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


class Celery:
    label = "celery"

    def __init__(self) -> None:
        _done_file()
        from . import celery_app

        celery_app.flush()
        self.noop = celery_app.noop

    def enqueue(self, seq=None) -> None:
        self.noop.delay(seq=seq)

    def enqueue_bulk(self, n: int) -> None:
        # No bulk send: a group still publishes one message per task.
        for _ in range(n):
            self.noop.delay()

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        self.noop.apply_async(kwargs={"seq": seq}, countdown=delay_s)

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "celery", "-A", "bench.celery_app", "worker", "--loglevel", "WARNING"]
        return cmd + flags(setting)


class PgQueuer:
    label = "pgqueuer"

    def __init__(self) -> None:
        _done_file()
        os.environ["PGQUEUER_DSN"] = pgqueuer_dsn()
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        self.loop = asyncio.new_event_loop()
        self.conn = self.loop.run_until_complete(asyncpg.connect(os.environ["PGQUEUER_DSN"]))
        self.queries = Queries(AsyncpgDriver(self.conn))

    def enqueue(self, seq=None) -> None:
        payload = None if seq is None else f'{{"seq": {seq}}}'.encode()
        self.loop.run_until_complete(self.queries.enqueue("noop", payload))

    def enqueue_bulk(self, n: int) -> None:
        for start in range(0, n, 5000):
            size = min(5000, n - start)
            self.loop.run_until_complete(self.queries.enqueue(["noop"] * size, [None] * size, [0] * size))

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        payload = f'{{"seq": {seq}}}'.encode()
        after = dt.timedelta(seconds=delay_s)
        self.loop.run_until_complete(self.queries.enqueue("noop", payload, execute_after=after))

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "bench.pgq_app"]
        return cmd + flags(setting)


def pgqueuer_dsn() -> str:
    return f"postgresql://{os.environ.get('PGUSER', 'root')}@127.0.0.1:5432/{DB}"


class Huey:
    label = "huey"

    def __init__(self) -> None:
        _done_file()
        from .huey_app import noop

        self.noop = noop

    def enqueue(self, seq=None) -> None:
        self.noop(seq=seq)

    def enqueue_bulk(self, n: int) -> None:
        # No bulk enqueue in Huey.
        for _ in range(n):
            self.noop()

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        self.noop.schedule(kwargs={"seq": seq}, delay=delay_s)

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "huey.bin.huey_consumer", "bench.huey_app.huey", "--logfile", "/dev/null"]
        return cmd + flags(setting)


class DjangoQ2:
    label = "django_q2"
    FUNC = "bench.benchapp.q_tasks.noop"

    def __init__(self) -> None:
        _done_file()
        _django()
        from django_q.tasks import async_task

        self.async_task = async_task

    def enqueue(self, seq=None) -> None:
        self.async_task(self.FUNC, seq=seq)

    def enqueue_bulk(self, n: int) -> None:
        # No bulk enqueue in django-q2.
        for _ in range(n):
            self.async_task(self.FUNC)

    def enqueue_delayed(self, seq: int, delay_s: float) -> None:
        # Its scheduler is the way to run a task later (async_task has no delay).
        from django.utils import timezone
        from django_q.models import Schedule
        from django_q.tasks import schedule

        schedule(self.FUNC, seq=seq, schedule_type=Schedule.ONCE, repeats=1,
                 next_run=timezone.now() + dt.timedelta(seconds=delay_s))

    def worker_cmd(self, setting: str | None) -> list[str]:
        cmd = [PY, "-m", "django", "qcluster"]
        return cmd + flags(setting)


ADAPTERS = {
    "cairnq_django": CairnQDjango,
    "django_tasks_db": DjangoTasksDB,
    "procrastinate": Procrastinate,
    "cairnq": CairnQSDK,
    "celery": Celery,
    "pgqueuer": PgQueuer,
    "huey": Huey,
    "django_q2": DjangoQ2,
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
