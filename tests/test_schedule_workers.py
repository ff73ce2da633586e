"""Schedules in real worker processes: each occurrence enqueued exactly once."""

from __future__ import annotations

import signal

import pytest

from cairnq_django.models import ScheduleState, Task
from tests.workerutil import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

# Workers serve "default"; the scheduled tasks go to a queue no worker serves,
# so they stay queued and can be counted.
SCHEDULE = {"tick": {"task": "tests.echo", "every": 1000, "queue": "schedule-test"}}
RUN_FOR_MS = 20_000


def occurrences() -> list[int]:
    return list(
        Task.objects.filter(metadata__schedule="tick")
        .order_by("created_at_ms")
        .values_list("metadata__occurrence_ms", flat=True)
    )


def start_worker(env) -> WorkerProcess:
    return WorkerProcess(env, "--poll", "500", settings={"SCHEDULE": SCHEDULE})


def test_three_workers_enqueue_each_occurrence_once_through_a_sigkill(live_store, child_env):
    workers = [start_worker(child_env) for _ in range(3)]
    kills = 0
    try:
        first = wait_for(occurrences, timeout=120, message="No occurrence was ever enqueued.")[0]
        # A third of the way in, SIGKILL a worker and start another in its place.
        wait_for(lambda: occurrences()[-1] - first >= RUN_FOR_MS // 3, timeout=120)
        victim = workers.pop(0)
        victim.signal(signal.SIGKILL)
        victim.wait(30)
        victim.stop()
        kills += 1
        workers.append(start_worker(child_env))
        wait_for(
            lambda: occurrences()[-1] - first >= RUN_FOR_MS, timeout=180,
            message="The schedule stopped advancing after the SIGKILL.",
        )
        for worker in workers:
            worker.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(60) == 0, worker.output()
        logs = "\n".join(worker.output() for worker in workers)
    finally:
        for worker in workers:
            worker.stop()
    row = ScheduleState.objects.get(name="tick")
    found = occurrences()
    # Every whole second after the schedule was first seen, up to where its
    # cursor stopped, exactly once.
    expected = list(range((row.created_at_ms // 1000 + 1) * 1000, row.cursor_ms + 1, 1000))
    duplicates = len(found) - len(set(found))
    missing = sorted(set(expected) - set(found))
    print(
        f"\nexactly-once: {len(expected)} occurrences, {len(found)} tasks, "
        f"{duplicates} duplicates, {len(missing)} missed, {kills} kill(s)"
    )
    assert len(expected) >= RUN_FOR_MS // 1000
    assert found == expected, (missing, logs)
    # The schedulers reported no error (they report with phase=schedule).
    assert "phase=schedule" not in logs, logs


def test_a_schedule_runs_a_framework_task(live_store, child_env):
    env = {**child_env, "DJANGO_SETTINGS_MODULE": "tests.settings_tasks"}
    schedule = {"add": {"task": "tests.tasksapp.tasks.add", "every": 1000, "args": [2, 3]}}
    worker = WorkerProcess(env, "--poll", "200", settings={"SCHEDULE": schedule})
    try:
        done = wait_for(
            lambda: Task.objects.filter(metadata__schedule="add", status="succeeded").first(),
            timeout=120, message="No scheduled framework task succeeded.",
        )
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
    finally:
        worker.stop()
    assert done.name == "tests.tasksapp.tasks.add"
    assert done.payload == {"args": [2, 3], "kwargs": {}}
    assert done.result == 5
