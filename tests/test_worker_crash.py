"""Crashes, signals and starved heartbeats, with real worker processes."""

import signal
import time

import pytest

from cairnq_django import enqueue, get
from tests.storeutil import sql
from tests.workerutil import (
    WorkerProcess,
    run_burst,
    runs,
    wait_for,
)

pytestmark = pytest.mark.slow


def test_sigkill_mid_task_is_redelivered_after_the_lease(live_store, child_env, runs_table):
    task = enqueue("tests.sleep", {"seconds": 2, "record": True})
    first = WorkerProcess(child_env, "--lease", "1500", "--poll", "100")
    second = None
    try:
        running = wait_for(
            lambda: (row := get(task.id)).status == "running" and row, timeout=60
        )
        first.signal(signal.SIGKILL)
        first.wait(30)
        second = WorkerProcess(child_env, "--lease", "1500", "--poll", "100")
        done = wait_for(
            lambda: (row := get(task.id)).status == "succeeded" and row, timeout=90,
            message="The task of the killed worker was never finished by another one.",
        )
        second.signal(signal.SIGTERM)
        assert second.wait(60) == 0
        # Shown if the second worker lost its own lease too (attempt 3): its
        # log says whether the heartbeat ran late or a renewal failed.
        log = second.output()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert done.attempt == 2, log
    assert done.worker_id != running.worker_id
    # Only the second worker got as far as recording a run.
    assert [(r[0], r[1], r[2]) for r in runs("slept")] == [(task.id, done.worker_id, 2)]


def test_sigterm_waits_for_running_handlers(live_store, child_env, runs_table):
    tasks = [enqueue("tests.sleep", {"seconds": 1, "record": True}) for _ in range(2)]
    worker = WorkerProcess(child_env, "--concurrency", "2", "--shutdown-timeout", "60000")
    try:
        wait_for(lambda: all(get(t.id).status == "running" for t in tasks), timeout=60)
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        worker.stop()
    assert [get(t.id).status for t in tasks] == ["succeeded", "succeeded"]
    assert sorted(r[0] for r in runs("slept")) == sorted(t.id for t in tasks)


def test_sigterm_during_work_loses_nothing(live_store, child_env, runs_table):
    tasks = [enqueue("tests.sleep", {"seconds": 5, "record": True}) for _ in range(6)]
    worker = WorkerProcess(
        child_env, "--concurrency", "2", "--shutdown-timeout", "200", "--lease", "60000"
    )
    try:
        wait_for(lambda: sum(get(t.id).status == "running" for t in tasks) == 2, timeout=60)
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
        out = worker.output()
    finally:
        worker.stop()
    rows = [get(t.id) for t in tasks]
    # Nothing is left running under a dead worker's lease, nothing failed.
    assert sorted(r.status for r in rows) == ["queued"] * 6, out
    abandoned = [r for r in rows if r.attempt == 1]
    assert len(abandoned) == 2
    for row in abandoned:
        assert row.error["code"] == "worker_shutdown"
        assert row.error["retryable"] is True
        # Requeued for now, not after a lease: claimable at once.
        assert row.run_at_ms <= row.updated_at_ms
    assert "Abandoning tests.sleep" in out
    # Another worker finishes all six.
    run_burst(child_env, "--concurrency", "6", timeout=120)
    assert [get(t.id).status for t in tasks] == ["succeeded"] * 6
    assert sorted(r[0] for r in runs("slept")) == sorted(t.id for t in tasks)


def test_second_signal_exits_at_once(live_store, child_env):
    task = enqueue("tests.sleep", {"seconds": 60})
    worker = WorkerProcess(child_env, "--shutdown-timeout", "120000")
    try:
        wait_for(lambda: get(task.id).status == "running", timeout=60)
        worker.signal(signal.SIGTERM)
        wait_for(lambda: "no new tasks will be claimed" in worker.output(), timeout=30)
        worker.signal(signal.SIGINT)
        assert worker.wait(30) == 1
        out = worker.output()
    finally:
        worker.stop()
    assert "exiting now without waiting" in out
    # Left to lease recovery, as a crash would be.
    assert get(task.id).status == "running"


def test_handler_holding_the_gil_is_reported(live_store, child_env):
    # sum() over a range is one C call that never releases the GIL. Size it to
    # hold the GIL for ~1.5 s here, well over two 200 ms heartbeat intervals
    # (a beat is reported once it is more than one interval late).
    started = time.perf_counter()
    sum(range(5_000_000))
    per_item = (time.perf_counter() - started) / 5_000_000
    n = max(10_000_000, int(1.5 / per_item))
    task = enqueue("tests.gil_hog", {"n": n}, max_attempts=1)
    out = run_burst(child_env, "--lease", "600", timeout=180)
    assert "The heartbeat ran" in out and "ms late" in out, out
    assert "held the GIL" in out
    # The lease was at risk and may well have been lost; either way it ended.
    assert get(task.id).status in ("succeeded", "failed")


def test_lease_loss_is_flagged_and_nothing_more_is_written(live_store, child_env):
    task = enqueue("tests.wait_cancel", {"timeout": 3})
    worker = WorkerProcess(child_env, "--burst", "--lease", "600")
    try:
        # Past the handler's own first write: the heartbeat is what notices.
        wait_for(lambda: get(task.id).message == "started", timeout=60)
        sql(
            live_store.using,
            "UPDATE cairnq_tasks SET worker_id = 'worker_thief',"
            " lease_until_ms = lease_until_ms + 600000 WHERE id = %s",
            [task.id],
        )
        assert worker.wait(60) == 0
        out = worker.output()
    finally:
        worker.stop()
    row = get(task.id)
    assert row.status == "running" and row.worker_id == "worker_thief"
    assert row.result is None
    assert f"Task tests.wait_cancel {task.id} lost its lease" in out
