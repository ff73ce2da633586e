"""SIGTERM with tasks in flight: nothing is left running under a dead lease.

A worker that receives SIGTERM stops claiming, gives running handlers
--shutdown-timeout to finish, then abandons the rest: each is failed
retryably with code `worker_shutdown` and no delay, so it is queued again at
once. After the process exits every task must be finished, or queued (never
claimed, or handed back with `worker_shutdown`); none may be `running`, which
would leave it to wait out a lease nobody renews. The leases here are a
minute long, so such a leftover could not hide behind a quick expiry.
"""

import signal
from collections import Counter

import pytest
from django.db import connections

from cairnq_django import enqueue, enqueue_many, get
from tests.workerutil import (
    WorkerProcess,
    run_burst,
    runs,
    wait_for,
)

pytestmark = pytest.mark.slow

LONG_LEASE = "60000"


def _task_summaries():
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT id, status, attempt, error FROM cairnq_tasks")
        return cursor.fetchall()


def _outcome(row) -> str:
    """Classify a row after the worker exited; 'bad' for anything not allowed."""
    task = get(row[0])
    if task.status == "succeeded":
        return "succeeded"
    if task.status == "queued" and task.attempt == 0 and task.error is None:
        return "never claimed"
    if (
        task.status == "queued" and isinstance(task.error, dict)
        and task.error.get("code") == "worker_shutdown" and task.error.get("retryable") is True
        # Handed back for now, not after a backoff or a lease.
        and task.run_at_ms <= task.updated_at_ms and task.worker_id is None
    ):
        return "worker_shutdown"
    return f"bad: {task.status} attempt {task.attempt} error {task.error}"


def test_sigterm_finishes_short_handlers_and_hands_back_long_ones(
    live_store, child_env, runs_table
):
    # Short handlers end well inside the grace period, long ones outlive it.
    short = [enqueue("tests.sleep", {"seconds": 0.5, "record": True}, priority=5)
             for _ in range(3)]
    long = [enqueue("tests.sleep", {"seconds": 8, "record": True}, priority=5)
            for _ in range(3)]
    worker = WorkerProcess(
        child_env, "--concurrency", "6", "--shutdown-timeout", "4000",
        "--lease", LONG_LEASE, "--poll", "100",
    )
    try:
        wait_for(lambda: all(get(t.id).status == "running" for t in short + long), timeout=60,
                 message="The six tasks never ran together.")
        # Queued behind them, with no free slot left to claim them.
        extra = [enqueue("tests.sleep", {"seconds": 0.5, "record": True}) for _ in range(3)]
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
        out = worker.output()
    finally:
        worker.stop()
    outcomes = {t.id: _outcome((t.id,)) for t in short + long + extra}
    print(f"\nSIGTERM, 6 in flight (grace 4000 ms): {Counter(outcomes.values())}")
    assert not [o for o in outcomes.values() if o.startswith("bad")], (outcomes, out)
    assert [outcomes[t.id] for t in short] == ["succeeded"] * 3, out
    assert [outcomes[t.id] for t in long] == ["worker_shutdown"] * 3, out
    # An extra may have been claimed if a short task ended before the signal.
    assert {outcomes[t.id] for t in extra} <= {"never claimed", "succeeded", "worker_shutdown"}
    assert out.count("Abandoning tests.sleep") == 3, out
    slept = Counter(r[0] for r in runs("slept"))
    assert all(slept[t.id] == 1 for t in short) and not any(slept[t.id] for t in long)
    # What was handed back is claimable at once: another worker finishes it all.
    run_burst(child_env, "--concurrency", "6", timeout=120)
    assert [get(t.id).status for t in short + long + extra] == ["succeeded"] * 9
    assert [get(t.id).attempt for t in long] == [2, 2, 2]
    slept = Counter(r[0] for r in runs("slept"))
    assert all(slept[t.id] == 1 for t in short + long + extra)


def test_sigterm_in_a_flood_of_short_tasks_leaves_nothing_running(
    live_store, child_env, runs_table
):
    # Hundreds of short tasks, every tenth longer than the grace period: at the
    # signal some are claimed but not started, some running, some returned and
    # waiting for the settler's group commit, and the long ones are abandoned.
    total = 1_500
    enqueue_many(
        {"name": "tests.sleep", "payload": {"seconds": 1.0 if i % 10 == 0 else 0.01,
                                            "record": True}}
        for i in range(total)
    )
    worker = WorkerProcess(
        child_env, "--concurrency", "8", "--shutdown-timeout", "100",
        "--lease", LONG_LEASE, "--poll", "100",
    )

    def progressed():
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM cairnq_tasks WHERE status = 'succeeded'")
            return cursor.fetchone()[0] >= 100

    try:
        wait_for(progressed, timeout=90, message="The worker never got going.")
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
        out = worker.output()
    finally:
        worker.stop()
    outcomes = Counter(_outcome(row) for row in _task_summaries())
    print(f"\nSIGTERM in a flood of {total} short tasks (grace 100 ms): {dict(outcomes)}")
    assert sum(outcomes.values()) == total
    assert not [o for o in outcomes if o.startswith("bad")], (outcomes, out[-5000:])
    assert outcomes["succeeded"] >= 100
    assert outcomes["worker_shutdown"] >= 1, out[-5000:]
    # No attempt ran to its end twice; every success was recorded by its run.
    recorded = Counter((r[0], r[2]) for r in runs("slept"))
    assert max(recorded.values()) == 1
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT id, attempt FROM cairnq_tasks WHERE status = 'succeeded'")
        assert all(recorded[(task_id, attempt)] == 1 for task_id, attempt in cursor.fetchall())
