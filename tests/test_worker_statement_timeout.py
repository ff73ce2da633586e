"""The worker's own statements carry a statement timeout, sent in the same round trip."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import OperationalError, connection, connections
from django.test import override_settings

from cairnq_django.store.timeouts import bounded_statements, statement_prefix
from cairnq_django.worker.connections import statement_timeout_ms

only_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="statement_timeout")


def test_the_timeout_defaults_to_a_third_of_the_lease():
    assert statement_timeout_ms(30_000) == 10_000
    with override_settings(CAIRNQ={"WORKER_STATEMENT_TIMEOUT": 2_500}):
        assert statement_timeout_ms(30_000) == 2_500
    with override_settings(CAIRNQ={"WORKER_STATEMENT_TIMEOUT": 0}):
        assert statement_timeout_ms(30_000) is None


def test_only_inside_the_block_and_only_on_this_thread():
    assert statement_prefix() is None
    with bounded_statements(500):
        assert "= 500;" in (statement_prefix() or "")
        with bounded_statements(None):
            assert statement_prefix() is None
        assert statement_prefix() is not None
    assert statement_prefix() is None


def test_claims_and_renewals_work_inside_the_block(live_store):
    task = live_store.submit("tests.echo", {"n": 1})
    with bounded_statements(5_000):
        claimed = live_store.claim(queues=["default"], worker_id="w1", lease_ms=30_000)
        assert [t.id for t in claimed] == [task.id]
        assert live_store.heartbeat_batch([task.id], "w1", 30_000) == {task.id: False}
        rows = live_store.complete_encoded_many([(task.id, "w1", '{"ok": true}')])
    assert rows[0] is not None and rows[0].status == "succeeded"


def _lock_row(task_id):
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    other = psycopg.connect(**params)
    other.execute("SELECT 1 FROM cairnq_tasks WHERE id = %s FOR UPDATE", [task_id])
    return other


@only_postgres
def test_a_renewal_stuck_on_a_row_lock_is_cut_off(live_store):
    task = live_store.submit("tests.echo", {"n": 1})
    live_store.claim(queues=["default"], worker_id="w1", lease_ms=30_000)
    other = _lock_row(task.id)
    try:
        started = time.monotonic()
        with bounded_statements(300), pytest.raises(OperationalError, match="statement timeout"):
            live_store.heartbeat_batch([task.id], "w1", 30_000)
        # Cut off by the timeout, long before the lock would have gone.
        assert time.monotonic() - started < 2.5
    finally:
        other.rollback()
        other.close()
    # The session itself is untouched: the setting lasted one transaction.
    with connections["default"].cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"
    assert live_store.heartbeat_batch([task.id], "w1", 30_000) == {task.id: False}
