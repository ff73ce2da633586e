"""What one enqueue() says to the database: the exact statements, so none creeps back in.

On PostgreSQL every statement is a round trip, read from libpq's own trace of
the wire (so psycopg's implicit BEGIN and Django's COMMIT are seen as well as
the cursor's statements); on SQLite the statements come from Django's cursor
and the commits from the connection. Counts are deterministic, unlike
timings: bench/ measures the rate of one-at-a-time enqueues.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from django.db import DatabaseError, connection, transaction

import cairnq_django
from cairnq_django import AlreadyExists
from cairnq_django.store.application import ApplicationOperations

_KINDS = (
    (r"BEGIN", "BEGIN"),
    (r"COMMIT", "COMMIT"),
    (r"ROLLBACK", "ROLLBACK"),
    (r"SAVEPOINT", "SAVEPOINT"),
    (r"RELEASE SAVEPOINT", "RELEASE"),
    (r"SELECT pg_advisory_xact_lock", "LOCK key"),
    (r"SELECT .* FROM \"cairnq_tasks\"", "SELECT task"),
    (r"INSERT INTO \"cairnq_tasks\"", "INSERT task"),
    (r"INSERT INTO \"cairnq_task_keys\"", "INSERT key"),
)


def _kind(sql: str) -> str:
    for pattern, kind in _KINDS:
        if re.match(pattern, sql.strip(), re.DOTALL):
            return kind
    return sql.strip()[:60]


@contextmanager
def _postgres_wire() -> Iterator[list[str]]:
    """The statements psycopg sends while the block runs, one per round trip."""
    from psycopg import pq

    seen: list[str] = []
    pgconn = connection.connection.pgconn
    fd, path = tempfile.mkstemp()
    try:
        pgconn.trace(fd)
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield seen
        finally:
            pgconn.untrace()
        with open(path) as trace:
            pending = ""
            for line in trace:
                direction, _, message, *rest = line.rstrip("\n").split("\t")
                if direction != "F":
                    continue
                text = rest[0].strip().strip('"') if rest else ""
                if message == "Query":  # simple protocol: one message, one round trip
                    seen.append(_kind(text))
                elif message == "Parse":  # extended protocol: ends at Sync
                    pending = text.split('" "', 1)[-1]
                elif message == "Sync":
                    seen.append(_kind(pending))
    finally:
        os.close(fd)
        os.unlink(path)


@contextmanager
def _sqlite_statements() -> Iterator[list[str]]:
    """The statements Django's cursor runs, and each commit, while the block runs."""
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(_kind(sql))
        return execute(sql, params, many, context)

    real_commit = connection._commit

    def commit() -> None:
        seen.append("COMMIT")
        real_commit()

    with connection.execute_wrapper(record), mock.patch.object(connection, "_commit", commit):
        yield seen


@contextmanager
def statements() -> Iterator[list[str]]:
    connection.ensure_connection()
    if connection.vendor == "postgresql":
        with _postgres_wire() as seen:
            yield seen
    else:
        with _sqlite_statements() as seen:
            yield seen


def _key() -> str:
    return f"order-{uuid.uuid4().hex}"


@pytest.fixture
def warm(live_store):
    """A store whose statements are compiled and whose protocol version is checked:
    both happen once per process, not per enqueue."""
    cairnq_django.enqueue("tests.echo")
    cairnq_django.enqueue("tests.echo", key=_key())
    return live_store


def _postgres(expected: list[str]) -> list[str]:
    return expected if connection.vendor == "postgresql" else [
        kind for kind in expected if kind != "LOCK key"  # BEGIN IMMEDIATE holds the lock
    ]


def test_a_plain_enqueue_in_autocommit_is_one_insert(warm):
    with statements() as seen:
        cairnq_django.enqueue("tests.echo", {"n": 1})
    assert seen == ["INSERT task"]


def test_a_keyed_enqueue_in_autocommit_is_one_transaction(warm):
    with statements() as seen:
        cairnq_django.enqueue("tests.echo", {"n": 1}, key=_key())
    assert seen == _postgres(
        ["BEGIN", "LOCK key", "SELECT task", "INSERT task", "INSERT key", "COMMIT"]
    )


def test_a_plain_enqueue_in_the_callers_transaction_adds_only_its_insert(warm):
    with statements() as seen, transaction.atomic():
        cairnq_django.enqueue("tests.echo", {"n": 1})
    assert seen == ["BEGIN", "INSERT task", "COMMIT"]


def test_a_keyed_enqueue_in_the_callers_transaction_takes_no_savepoint(warm):
    with statements() as seen, transaction.atomic():
        cairnq_django.enqueue("tests.echo", {"n": 1}, key=_key())
    assert seen == _postgres(
        ["BEGIN", "LOCK key", "SELECT task", "INSERT task", "INSERT key", "COMMIT"]
    )


def test_a_reused_key_writes_nothing(warm):
    key = _key()
    first = cairnq_django.enqueue("tests.echo", key=key)
    with statements() as seen:
        again = cairnq_django.enqueue("tests.echo", key=key)
    assert again.id == first.id
    assert seen == _postgres(["BEGIN", "LOCK key", "SELECT task", "COMMIT"])


# ---------------------------------------------------------------- correctness without the savepoint
def _failing_key_write() -> mock._patch[mock.MagicMock]:
    return mock.patch.object(
        ApplicationOperations, "_point_key",
        side_effect=DatabaseError("the key row could not be written"),
    )


def _tasks_named(name: str) -> int:
    return len(cairnq_django.list_tasks(name=name))


def test_a_keyed_enqueue_that_fails_part_way_in_autocommit_leaves_nothing(warm):
    with _failing_key_write():
        with pytest.raises(DatabaseError):
            cairnq_django.enqueue("tests.half", key=_key())
    assert _tasks_named("tests.half") == 0


def test_a_keyed_enqueue_that_fails_part_way_cannot_commit_with_the_caller(warm):
    """The task row is written before the key row fails: the caller's transaction,
    even if it catches the error and carries on, must not commit the task alone."""
    with transaction.atomic():
        cairnq_django.enqueue("tests.kept-back", {"n": 1})
        with _failing_key_write():
            with pytest.raises(DatabaseError):
                cairnq_django.enqueue("tests.half", key=_key())
        assert connection.needs_rollback
    assert _tasks_named("tests.half") == 0
    assert _tasks_named("tests.kept-back") == 0  # the whole transaction rolled back


def test_a_rejected_key_leaves_the_callers_transaction_usable(warm):
    key = _key()
    cairnq_django.enqueue("tests.echo", key=key)
    with transaction.atomic():
        cairnq_django.enqueue("tests.kept", {"n": 1})
        with pytest.raises(AlreadyExists):
            cairnq_django.enqueue("tests.echo", key=key, conflict="reject")
        cairnq_django.enqueue("tests.kept", {"n": 2})
    assert _tasks_named("tests.kept") == 2


def test_a_keyed_enqueue_rolls_back_with_the_caller(warm):
    key = _key()
    with pytest.raises(RuntimeError), transaction.atomic():
        cairnq_django.enqueue("tests.echo", key=key)
        raise RuntimeError("the caller's own write failed")
    assert cairnq_django.get_by_key(key) is None
    assert cairnq_django.enqueue("tests.echo", key=key).status == "queued"


# ---------------------------------------------------------------- the worker's side
def test_a_postgres_claim_in_autocommit_stays_one_round_trip(warm):
    """The recovery and the claim go out as one query (store/leases.py), which needs
    psycopg's client-side cursor to be recognised without importing psycopg."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no round trips to count")
    cairnq_django.enqueue("tests.echo")
    store = warm
    store.claim(queues=["default"], worker_id="warm-up", limit=1)  # compiles the statements
    cairnq_django.enqueue("tests.echo")
    with statements() as seen:
        [claimed] = store.claim(queues=["default"], worker_id="w", limit=1)
    assert claimed.name == "tests.echo"
    assert len(seen) == 1


def test_a_sqlite_worker_does_not_load_psycopg(child_env):
    """Importing psycopg and libpq cost a SQLite worker ~50 ms of its start-up."""
    if connection.vendor != "sqlite":
        pytest.skip("Django's PostgreSQL backend loads psycopg itself")
    code = (
        "import sys, django; django.setup(); "
        "import cairnq_django.store.leases, cairnq_django.worker.runner, cairnq_django.client; "
        "print('psycopg' in sys.modules)"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, check=True
    )
    assert found.stdout.strip() == "False", found.stderr
