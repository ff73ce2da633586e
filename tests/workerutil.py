"""Helpers for worker tests: start real worker processes, wait for conditions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.db import connections

from tests.testapp.tasks import RUNS_TABLE

ROOT = Path(__file__).resolve().parent.parent

# Runs the real command, after applying settings.CAIRNQ overrides from the
# environment (tests need e.g. RETRY_BACKOFF_BASE=0 without a settings file).
_RUNNER = (
    "import json, os, sys, django; django.setup();"
    "from django.conf import settings;"
    "settings.CAIRNQ = {**settings.CAIRNQ, **json.loads(os.environ['CAIRNQ_TEST_OVERRIDES'])};"
    "from django.core.management import execute_from_command_line;"
    "execute_from_command_line(['manage.py', 'cairnq_worker', *sys.argv[1:]])"
)


class WorkerProcess:
    """A `cairnq_worker` child process whose output goes to a temp file."""

    def __init__(
        self, env: dict, *args: str, settings: dict | None = None, new_session: bool = False
    ) -> None:
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix="cairnq-worker-", suffix=".log", delete=False
        )
        env = dict(env)
        if settings:
            env["CAIRNQ_TEST_OVERRIDES"] = json.dumps(settings)
            cmd = [sys.executable, "-c", _RUNNER, *args]
        else:
            cmd = [sys.executable, "-m", "django", "cairnq_worker", *args]
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            # A session (and process group) of its own, as a terminal gives
            # its foreground job, for tests that signal the whole group.
            start_new_session=new_session,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"The worker did not exit within {timeout}s. Its output:\n{self.output()}"
            ) from None

    def stop(self) -> None:
        """Kill the process if it is still running and remove its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


def run_burst(env: dict, *args: str, settings: dict | None = None, timeout: float = 120) -> str:
    """Run a burst worker to completion; return its output (asserting exit 0)."""
    worker = WorkerProcess(env, "--burst", "-v", "2", *args, settings=settings)
    try:
        code = worker.wait(timeout)
        out = worker.output()
        assert code == 0, f"The worker exited {code}:\n{out}"
        return out
    finally:
        worker.stop()


def wait_for(predicate, *, timeout: float = 60, interval: float = 0.05, message: str = ""):
    """Poll `predicate` until it returns a truthy value; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message or f"Condition not met within {timeout}s.")
        time.sleep(interval)


def create_runs_table() -> None:
    vendor = connections["default"].vendor
    pk = "serial PRIMARY KEY" if vendor == "postgresql" else "integer PRIMARY KEY AUTOINCREMENT"
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (id {pk}, task_id text NOT NULL,"
            " worker_id text NOT NULL, attempt integer NOT NULL, note text NOT NULL)"
        )
        cursor.execute(f"DELETE FROM {RUNS_TABLE}")


def runs(note: str | None = None) -> list[tuple]:
    """Rows of the runs table as (task_id, worker_id, attempt, note), in insert order."""
    sql = f"SELECT task_id, worker_id, attempt, note FROM {RUNS_TABLE}"
    params: list = []
    if note is not None:
        sql += " WHERE note = %s"
        params.append(note)
    with connections["default"].cursor() as cursor:
        cursor.execute(sql + " ORDER BY id", params)
        return [tuple(row) for row in cursor.fetchall()]


def drop_runs_table() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {RUNS_TABLE}")
