"""Per-attempt history written by real worker processes: retries, and a worker killed mid-task."""

import signal

import pytest

from cairnq_django import enqueue, get, get_task
from cairnq_django.models import TaskAttempt
from cairnq_django.store.attempts import LOST_ERROR
from tests.workerutil import WorkerProcess, run_burst, wait_for

pytestmark = pytest.mark.slow

NO_BACKOFF = {"RETRY_BACKOFF_BASE": 0}


def test_two_failures_then_a_success_are_three_attempts(live_store, child_env):
    task = enqueue("tests.flaky", {"succeed_on": 3}, max_attempts=3)
    run_burst(child_env, settings=NO_BACKOFF)

    history = get_task(task.id)

    assert [(a.attempt, a.outcome) for a in history.attempts] == [
        (1, "retried"), (2, "retried"), (3, "succeeded"),
    ]
    first, second, final = history.attempts
    assert first.error["message"] == "flaky failure on attempt 1"
    assert second.error["message"] == "flaky failure on attempt 2"
    assert "Traceback" in second.error["details"]["traceback"]
    worker = history.task.worker_id
    assert [a.worker_id for a in history.attempts] == [worker] * 3
    assert first.started_at_ms <= first.ended_at_ms <= second.started_at_ms <= second.ended_at_ms
    assert final.ended_at_ms == history.task.completed_at_ms
    assert history.task.status == "succeeded" and history.error is None and final.error is None
    # Only the two failed attempts are rows; the success is the task row itself.
    assert TaskAttempt.objects.filter(task_id=task.id).count() == 2


def test_a_killed_workers_attempt_is_recorded_as_lost(live_store, child_env):
    task = enqueue("tests.sleep", {"seconds": 2})
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
        log = second.output()
    finally:
        first.stop()
        if second is not None:
            second.stop()

    history = get_task(task.id)

    # A second loss (the surviving worker's heartbeat starved on a loaded box)
    # would show as one more "lost" row: the log says why.
    assert [(a.attempt, a.outcome) for a in history.attempts] == [(1, "lost"), (2, "succeeded")], log
    lost, final = history.attempts
    assert lost.error == LOST_ERROR
    assert lost.ended_at_ms >= running.updated_at_ms
    assert final.worker_id == done.worker_id != running.worker_id
