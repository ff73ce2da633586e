"""Workers, wait(), the wakeups, the sweeper and the scheduler on an alias with Django's pool.

Real worker processes run with tests/settings_pool.py: the default alias has
OPTIONS["pool"] with fewer connections (4) than the worker has handler threads
(concurrency 8, so 16 threads, plus the claim loop, settler, heartbeat,
presence, scheduler and sweeper). PostgreSQL's pg_stat_activity counts the
sessions before, during and after.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
from django.db import connections

from cairnq_django import cancel, enqueue, get
from cairnq_django.store.executor import unreadable_meta_error
from tests.workerutil import ROOT, WorkerProcess, wait_for

only_postgres = pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="Django's pool is PostgreSQL's"
)

POOL_MAX = 4
POOL = {"min_size": 1, "max_size": POOL_MAX, "timeout": 20}
# Failures that a starved or deadlocked pool shows in a worker's log.
STARVED = ("PoolTimeout", "couldn't get a connection", "recovered from an error", "Traceback")


@pytest.fixture
def pool_env(child_env):
    env = dict(child_env, DJANGO_SETTINGS_MODULE="tests.settings_pool")
    env["CAIRNQ_TEST_POOL"] = json.dumps(POOL)
    return env


def backend_pid() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def other_sessions(also_mine: tuple[int, ...] = ()) -> int:
    """Client sessions on the test database other than this thread's (and `also_mine`)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND NOT (pid = ANY(%s))"
            " AND backend_type = 'client backend'",
            [list(also_mine)],
        )
        return int(cursor.fetchone()[0])


class SessionSampler(threading.Thread):
    """Count the other sessions every few milliseconds; keep the highest count."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        # The test's own thread queries too; its session is not the worker's.
        self.test_session = backend_pid()
        self.highest = 0
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(0.01):
                self.highest = max(self.highest, other_sessions((self.test_session,)))
                self.samples += 1
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


@only_postgres
def test_worker_on_a_pool_smaller_than_its_concurrency(live_store, pool_env):
    # The sweeper runs in the worker: a canceled task is the rule's to delete.
    doomed = enqueue("tests.echo")
    cancel(doomed.id)
    tasks = [enqueue("tests.orm_write", {"hold_s": 0.005}) for _ in range(300)]
    # An earlier test's process may still be closing its session: the server
    # drops it a moment after the socket closes. Count from none.
    wait_for(lambda: other_sessions() == 0, timeout=30,
             message=f"sessions left by earlier tests: {other_sessions()}")
    before = other_sessions()
    settings = {
        "SCHEDULE": {"pool-tick": {"task": "tests.echo", "every": 1000}},
        "RETENTION": {"canceled": 0},
        "SWEEP_INTERVAL": 300,
    }
    worker = WorkerProcess(pool_env, "--concurrency", "8", "--sweep", "-v", "2", settings=settings)
    sampler = SessionSampler()
    sampler.start()
    try:
        try:
            wait_for(lambda: worker.proc.poll() is not None
                     or all(get(t.id).status == "succeeded" for t in tasks), timeout=120)
            assert worker.proc.poll() is None, "the worker exited"
        except AssertionError:
            raise AssertionError(f"Not every ORM task finished. Worker:\n{worker.output()}") from None
        # The scheduler enqueued on the pool and its occurrence ran; the sweeper deleted.
        wait_for(lambda: live_store.tasks().filter(name="tests.echo", status="succeeded").exists(),
                 timeout=30, message="no scheduled occurrence ran")
        wait_for(lambda: get(doomed.id) is None, timeout=30, message="the sweeper deleted nothing")
        during = sampler.highest
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
        out = worker.output()
    finally:
        sampler.stop()
        worker.stop()
    # The server notices the closed sockets a moment after the process exits.
    wait_for(lambda: other_sessions() == 0, timeout=30,
             message=f"sessions left after the worker exited: {other_sessions()}")
    print(f"pooled worker sessions: before={before} highest-during={during} "
          f"({sampler.samples} samples) after={other_sessions()}")
    assert before == 0
    # The pool's connections and the wakeup's own LISTEN session; never more.
    assert 1 <= during <= POOL_MAX + 1, out
    for sign in STARVED:
        assert sign not in out, out
    # Every handler saw its own row committed: no task ran twice or half-written.
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*), count(DISTINCT name) FROM auth_group WHERE name LIKE 'pool-%%'")
        assert tuple(cursor.fetchone()) == (300, 300)


_WAITERS = textwrap.dedent("""
    import django, sys, threading
    django.setup()
    from django.db import connections
    from cairnq_django import enqueue, wait
    ok = []
    def one(i):
        try:
            task = enqueue("tests.sleep", {"seconds": 0.3})
            ok.append(wait(task.id, timeout=60).status)
        finally:
            connections.close_all()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(int(sys.argv[1]))]
    for t in threads: t.start()
    for t in threads: t.join()
    print("waited:", ok.count("succeeded"))
""")


@only_postgres
def test_many_waits_share_a_small_pool(live_store, pool_env):
    worker = WorkerProcess(pool_env, "--concurrency", "16")
    try:
        waiters = subprocess.run(
            [sys.executable, "-c", _WAITERS, "12"], env=pool_env, cwd=ROOT,
            capture_output=True, text=True, timeout=120,
        )
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(60)
        worker.stop()
    assert waiters.returncode == 0, waiters.stderr
    assert "waited: 12" in waiters.stdout, waiters.stdout + waiters.stderr
    # Twelve waits, four pool slots: a wait that kept its slot while asleep
    # would leave the others to time out taking one.
    assert "lost its connection" not in waiters.stderr, waiters.stderr


@only_postgres
def test_a_pool_with_a_persistent_lifetime_stops_the_worker_saying_why(live_store, pool_env):
    enqueue("tests.echo")
    env = dict(pool_env, CAIRNQ_TEST_CONN_MAX_AGE="60")
    worker = WorkerProcess(env, "-v", "2")
    try:
        code = worker.wait(60)
        out = worker.output()
    finally:
        worker.stop()
    assert code != 0
    assert "Pooling doesn't support persistent connections" in out, out
    assert "tables are missing" not in out, out


def test_only_a_missing_table_is_reported_as_one(db, monkeypatch):
    """The catalog decides (tables.py), not the text of the error."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import OperationalError, ProgrammingError, transaction

    from cairnq_django.store import executor

    missing = None
    try:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1 FROM cairnq_no_such_table")
    except (ProgrammingError, OperationalError) as exc:  # PostgreSQL's, SQLite's
        missing = exc
    assert missing is not None
    # Every CairnQ table is there, whatever the error says.
    assert "tables are missing" not in str(unreadable_meta_error("default", missing))
    monkeypatch.setattr(executor, "known_missing_tables", lambda using: ["cairnq_meta"])
    assert "tables are missing" in str(unreadable_meta_error("default", missing))
    monkeypatch.undo()
    refused = unreadable_meta_error("default", OperationalError("connection refused"))
    assert "tables are missing" not in str(refused) and "connection refused" in str(refused)
    config = unreadable_meta_error("default", ImproperlyConfigured("Pooling doesn't ..."))
    assert isinstance(config, ImproperlyConfigured) and "Pooling doesn't" in str(config)
