"""Framework tasks run by a real `cairnq_worker` process, read back as TaskResults.

One burst worker (settings: tests.settings_tasks) runs every task at once, so
the test costs one process start per database.
"""

import signal
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.utils import timezone

import cairnq_django
from cairnq_django import compat
from tests.workerutil import WorkerProcess, run_burst, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed"),
]

if compat.AVAILABLE:
    from cairnq_django.backends import await_result, wait_for_result
    from tests.tasksapp import extra_tasks, tasks

SUCCESSFUL = "SUCCESSFUL"


def test_the_worker_runs_framework_tasks(live_store, child_env, tmp_path):
    signal_log = tmp_path / "signals.log"
    marker = tmp_path / "imported"
    env = {
        **child_env,
        "DJANGO_SETTINGS_MODULE": "tests.settings_tasks",
        "CAIRNQ_TASKS_SIGNAL_LOG": str(signal_log),
        "CAIRNQ_UNDISCOVERED_MARKER": str(marker),
    }
    added = tasks.add.enqueue(2, 3)
    echoed = tasks.echo.enqueue(1, [2], x={"y": None})
    async_added = tasks.async_add.enqueue(4, 5)
    retried = tasks.fail_until.enqueue(attempt=2)
    failed = tasks.boom.enqueue("it broke")
    greeted = tasks.greet.enqueue("ann")
    multiplied = extra_tasks.multiply.enqueue(6, 7)
    unserializable = tasks.not_json.enqueue()
    # Raised by the task, not sent to the worker: each fails its own task only.
    raised = {
        kind: tasks.raise_base.enqueue(kind)
        for kind in ("SystemExit", "KeyboardInterrupt", "Halt")
    }
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(0, 0)
    # A row naming a module nothing discovers: never imported, never run.
    stray = cairnq_django.enqueue(
        "tests.tasksapp.undiscovered.side_effect", {"args": [], "kwargs": {}}
    )

    output = run_burst(env, settings={"RETRY_BACKOFF_BASE": 0})

    added.refresh()
    assert added.status == SUCCESSFUL and added.return_value == 5, output
    assert added.started_at is not None and added.last_attempted_at == added.started_at
    assert added.enqueued_at <= added.started_at <= added.finished_at
    assert added.attempts == 1 and len(added.worker_ids) == 1
    assert added.worker_ids[0] == cairnq_django.get(added.id).worker_id

    assert tasks.echo.get_result(echoed.id).return_value == {
        "args": [1, [2]], "kwargs": {"x": {"y": None}}
    }
    assert tasks.async_add.get_result(async_added.id).return_value == 9
    assert extra_tasks.multiply.get_result(multiplied.id).return_value == 42
    assert tasks.greet.get_result(greeted.id).return_value == "hello ann"

    retried.refresh()
    assert retried.status == SUCCESSFUL and retried.attempts == 2
    assert retried.return_value == {"attempt": 2, "attempts": 2, "worker_ids": 2, "id": retried.id}
    assert retried.last_attempted_at >= retried.started_at
    recorded = cairnq_django.get(retried.id).metadata["_django_task_attempts"]
    assert [a["attempt"] for a in recorded] == [1, 2]
    assert round(retried.started_at.timestamp() * 1000) == recorded[0]["started_at_ms"]
    assert round(retried.last_attempted_at.timestamp() * 1000) == recorded[1]["started_at_ms"]
    [first_error] = retried.errors
    assert first_error.exception_class is RuntimeError
    assert "not yet: attempt 1" in first_error.traceback

    failed.refresh()
    assert failed.status == "FAILED" and failed.is_finished and failed.attempts == 1
    [error] = failed.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert "Traceback" in error.traceback and "ValueError: it broke" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = failed.return_value
    row = cairnq_django.get(failed.id)
    assert (row.error["type"], row.error["code"], row.error["message"]) == (
        "ValueError", "handler_error", "it broke"
    )

    unserializable.refresh()
    assert unserializable.status == "FAILED" and unserializable.attempts == 1
    assert cairnq_django.get(unserializable.id).error["code"] == "unserializable_result"
    assert [e.exception_class for e in unserializable.errors] == [TypeError]

    for kind, result in raised.items():
        result.refresh()
        assert result.status == "FAILED", output
        assert [e.exception_class for e in result.errors] == [tasks.RAISABLE[kind]]

    assert cairnq_django.get(stray.id).status == "queued"
    assert cairnq_django.get(later.id).status == "queued"  # not due: left for later
    assert wait_for_result(added, timeout=10).return_value == 5
    assert async_to_sync(await_result)(failed, timeout=10).status == "FAILED"
    with pytest.raises(cairnq_django.TaskTimeout):
        wait_for_result(later, timeout=0.2)
    assert not marker.exists()

    lines = signal_log.read_text().splitlines()
    assert f"started {added.id} RUNNING" in lines
    assert f"finished {added.id} SUCCESSFUL" in lines
    assert f"finished {failed.id} FAILED" in lines
    # The retried task started twice and finished once.
    assert sum(line.startswith(f"started {retried.id}") for line in lines) == 2
    assert [line for line in lines if line.startswith(f"finished {retried.id}")] == [
        f"finished {retried.id} SUCCESSFUL"
    ]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_worker_still_stops_it_gracefully(live_store, child_env, tmp_path, signum):
    """A task raising KeyboardInterrupt fails; SIGINT/SIGTERM to the worker still drains it."""
    gate = tmp_path / "gate"
    interrupted = tasks.fail_with.enqueue(["KeyboardInterrupt", "SystemExit", "KeyboardInterrupt"])
    env = {**child_env, "DJANGO_SETTINGS_MODULE": "tests.settings_tasks"}
    worker = WorkerProcess(
        env, "--concurrency", "1", "--shutdown-timeout", "120000", "--poll", "50",
        settings={"RETRY_BACKOFF_BASE": 0},
    )
    try:
        wait_for(
            lambda: cairnq_django.get(interrupted.id).status == "failed", timeout=60,
            message="The task raising KeyboardInterrupt never failed.",
        )
        # The worker is still serving: it takes the next task.
        waiting = tasks.wait_for_file.enqueue(str(gate))
        wait_for(lambda: cairnq_django.get(waiting.id).status == "running", timeout=60)
        worker.signal(signum)
        wait_for(lambda: "no new tasks will be claimed" in worker.output(), timeout=30)
        stranded = tasks.add.enqueue(1, 1)  # claimed by no one: the worker is stopping
        gate.touch()
        assert worker.wait(60) == 0, worker.output()
        output = worker.output()
    finally:
        worker.stop()
    assert f"Received {signal.Signals(signum).name}; no new tasks will be claimed" in output
    interrupted.refresh()
    assert [e.exception_class for e in interrupted.errors] == [
        KeyboardInterrupt, SystemExit, KeyboardInterrupt
    ]
    # The running task was let finish, as a stop always does.
    assert tasks.wait_for_file.get_result(waiting.id).return_value == "opened"
    assert cairnq_django.get(stranded.id).status == "queued"
