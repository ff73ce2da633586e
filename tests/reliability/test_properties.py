"""Random sequences of client and worker operations keep the protocol's invariants.

Hypothesis drives the store through submits (keyed or not), claims by two
workers, heartbeats, progress, completions, failures, cancels, retries, purges
and leases running out, and after every step reads the whole table back:

- a lease is held if and only if the task is running (and then by a worker);
- a finished task has completed_at_ms and no lease; a live one has no completed_at_ms;
- every key points at a task that exists;
- a cancel requested while running wins over the completion that follows it;
- a worker write succeeds exactly when that worker holds the live lease.
"""

from __future__ import annotations

import pytest
from django.db import connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from cairnq_django.errors import AlreadyExists, LostLease
from cairnq_django.records import TERMINAL_STATUSES
from cairnq_django.store.leases import get_leases

WORKERS = ("w1", "w2")
# A worker strategy that mostly names the task's own lease holder, so writes
# that should succeed are drawn as often as those that should be refused.
OWNER = "owner"
ANY_WORKER = st.sampled_from((OWNER, OWNER, *WORKERS))
KEYS = ("k1", "k2", None)
CONFLICTS = ("reuse", "reuse-succeeded", "reject", "replace")


def all_rows() -> dict[str, dict]:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT id, status, worker_id, lease_until_ms, completed_at_ms, attempt,"
            " max_attempts, cancel_requested_at_ms FROM cairnq_tasks"
        )
        columns = [c[0] for c in cursor.description]
        return {row[0]: dict(zip(columns, row, strict=True)) for row in cursor.fetchall()}


def key_rows() -> dict[str, str]:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT key, task_id FROM cairnq_task_keys")
        return dict(cursor.fetchall())


class QueueMachine(RuleBasedStateMachine):
    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.store = get_leases("default")
        with connections["default"].cursor() as cursor:
            cursor.execute("DELETE FROM cairnq_task_keys")
            cursor.execute("DELETE FROM cairnq_tasks")
        self.cancel_pending: set[str] = set()  # running tasks asked to stop
        # Claim order by priority, newest lowest, so that a replayed sequence
        # claims the same tasks (ids and clocks differ between replays).
        self.next_priority = 0

    # ------------------------------------------------------------ client side
    @rule(target=tasks, key=st.sampled_from(KEYS), conflict=st.sampled_from(CONFLICTS),
          max_attempts=st.integers(1, 3))
    def submit(self, key, conflict, max_attempts):
        self.next_priority -= 1
        replaced = key_rows().get(key) if conflict == "replace" else None
        if replaced is not None and all_rows()[replaced]["status"] == "running":
            self.cancel_pending.add(replaced)  # "replace" asks the running task to stop
        try:
            task = self.store.submit(
                "prop.task", {"n": 1}, key=key, conflict=conflict, max_attempts=max_attempts,
                priority=self.next_priority,
            )
        except AlreadyExists:
            assert conflict == "reject" and key in key_rows()
            return self.store.get_by_key(key).id
        if key is not None:
            assert key_rows()[key] == task.id
        return task.id

    @rule(task_id=tasks)
    def cancel(self, task_id):
        before = all_rows().get(task_id)
        after = self.store.cancel(task_id)
        if before is None or before["status"] in TERMINAL_STATUSES:
            assert after is None
        elif before["status"] == "queued":
            assert after.status == "canceled"
        else:
            assert after.status == "running" and after.cancel_requested
            self.cancel_pending.add(task_id)

    @rule(task_id=tasks, reset=st.booleans())
    def retry(self, task_id, reset):
        before = all_rows().get(task_id)
        after = self.store.retry(task_id, reset_attempt=reset)
        if before is not None and before["status"] in ("failed", "canceled"):
            assert after.status == "queued" and not after.cancel_requested
            assert after.attempt == (0 if reset else before["attempt"])
        else:
            assert after is None

    @rule()
    def purge(self):
        # Time passes first: what finished in this very millisecond is not yet
        # older than the cutoff, and a replay must purge the same rows.
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "UPDATE cairnq_tasks SET completed_at_ms = completed_at_ms - 1000"
                " WHERE completed_at_ms IS NOT NULL"
            )
        before = all_rows()
        deleted = set(self.store.purge(older_than_ms=0, limit=1000))
        assert deleted == {t for t, r in before.items() if r["status"] in TERMINAL_STATUSES}
        self.cancel_pending -= deleted

    # ------------------------------------------------------------ worker side
    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 3))
    def claim(self, worker, limit):
        claimed = self.store.claim(queues=["default"], worker_id=worker, limit=limit)
        assert len(claimed) <= limit
        for task in claimed:
            assert task.status == "running" and task.worker_id == worker
            assert task.attempt >= 1  # a retry without reset may run one past max_attempts

    @rule(task_id=tasks)
    def lease_runs_out(self, task_id):
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "UPDATE cairnq_tasks SET lease_until_ms = 1 WHERE id = %s AND status = 'running'",
                [task_id],
            )

    def _owned_write(self, task_id, worker, write):
        """Run a worker write; it must succeed exactly when `worker` holds the lease."""
        before = all_rows().get(task_id)
        if worker == OWNER:
            worker = (before or {}).get("worker_id") or "w1"
        holds = (
            before is not None and before["status"] == "running"
            and before["worker_id"] == worker and before["lease_until_ms"] > 1
        )
        try:
            after = write(worker)
        except LostLease:
            assert not holds, f"{worker} held {task_id} but its write was refused"
            return None
        assert holds, f"{worker} did not hold {task_id} but its write went through"
        return after

    @rule(task_id=tasks, worker=ANY_WORKER)
    def heartbeat(self, task_id, worker):
        self._owned_write(task_id, worker, lambda w: self.store.heartbeat(task_id, w, 30_000))

    @rule(task_id=tasks, worker=ANY_WORKER, value=st.floats(0, 1))
    def progress(self, task_id, worker, value):
        after = self._owned_write(
            task_id, worker, lambda w: self.store.progress(task_id, w, value, "step")
        )
        if after is not None:
            assert after.progress == value and after.message == "step"

    @rule(task_id=tasks, worker=ANY_WORKER)
    def complete(self, task_id, worker):
        asked_to_stop = task_id in self.cancel_pending
        after = self._owned_write(
            task_id, worker, lambda w: self.store.complete(task_id, w, {"ok": True})
        )
        if after is not None:
            assert after.status == ("canceled" if asked_to_stop else "succeeded")
            self.cancel_pending.discard(task_id)

    @rule(task_id=tasks, worker=ANY_WORKER, retryable=st.booleans())
    def fail(self, task_id, worker, retryable):
        asked_to_stop = task_id in self.cancel_pending
        before = all_rows().get(task_id)
        after = self._owned_write(
            task_id, worker,
            lambda w: self.store.fail(task_id, w, "boom", retryable=retryable),
        )
        if after is None:
            return
        self.cancel_pending.discard(task_id)
        if asked_to_stop:
            assert after.status == "canceled"
        elif retryable and before["attempt"] < before["max_attempts"]:
            assert after.status == "queued"
        else:
            assert after.status == "failed"

    # ------------------------------------------------------------- invariants
    @invariant()
    def rows_keep_the_protocol(self):
        rows = all_rows()
        for row in rows.values():
            running = row["status"] == "running"
            assert (row["lease_until_ms"] is not None) == running, row
            if running:
                assert row["worker_id"] is not None, row
                assert row["attempt"] >= 1, row
            if row["status"] in TERMINAL_STATUSES:
                assert row["completed_at_ms"] is not None, row
            else:
                assert row["completed_at_ms"] is None, row
            if row["cancel_requested_at_ms"] is not None:
                assert row["status"] != "queued", row
        for key, task_id in key_rows().items():
            assert task_id in rows, f"key {key} points at missing task {task_id}"
        # A lease that ran out is settled at the next claim; until then the
        # tracked cancel stays pending, so forget tasks no longer running.
        self.cancel_pending &= {t for t, r in rows.items() if r["status"] == "running"}


@pytest.mark.slow
def test_random_operation_sequences_keep_the_invariants(store):
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,  # the same sequences on every run: CI cannot flake on a draw
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
            database=None,
        ),
    )
