"""Four worker processes drain 5,000 tasks: every task runs exactly once."""

import pytest
from django.db import connections

from cairnq_django import enqueue_many
from tests.workerutil import WorkerProcess, runs

pytestmark = pytest.mark.slow

TASKS = 5_000
WORKERS = 4


def test_four_workers_drain_5000_tasks_exactly_once(live_store, child_env, runs_table):
    enqueue_many([("tests.record", {"i": i}) for i in range(TASKS)])
    workers = [
        WorkerProcess(child_env, "--burst", "--concurrency", "4", "--lease", "30000")
        for _ in range(WORKERS)
    ]
    try:
        codes = [w.wait(900) for w in workers]
        outputs = [w.output() for w in workers]
    finally:
        for w in workers:
            w.stop()
    assert codes == [0] * WORKERS, "\n".join(outputs)

    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT status, attempt, count(*) FROM cairnq_tasks GROUP BY status, attempt"
        )
        by_state = {(status, attempt): n for status, attempt, n in cursor.fetchall()}
    assert by_state == {("succeeded", 1): TASKS}

    recorded = runs()
    assert len(recorded) == TASKS  # one handler run per task, no duplicates
    assert len({task_id for task_id, *_ in recorded}) == TASKS
    # The work was really shared (a worker that starts late may find little left).
    assert len({worker_id for _, worker_id, _, _ in recorded}) >= 2
