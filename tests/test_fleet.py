"""A fleet on one PostgreSQL database: 16 worker processes, 4 SIGKILLed and 4 started mid-drain.

20,000 short tasks are drained by 16 real `cairnq_worker` processes. Once a
quarter is done, 4 of them are SIGKILLed one after another (each while it
holds tasks) and 4 fresh ones are started. The handler appends
'<task> <attempt> <worker>' to a journal file when it returns, so the test
can tell every run that ended from the rows' final state.

Checked: no task lost (all 20,000 succeeded), no (task, attempt) ran to its
end twice, each task's final attempt is one its worker journaled, and re-runs
happen only for tasks a killed worker held. The drain's rate is printed
(pytest -s); whether 16 workers drain at least as fast as 4 is measured in
bench/herd.py --drain, not asserted here: on 2 busy cores a timed comparison
would be a flaky test.
"""

import os
import re
import signal
import tempfile
import time
from collections import Counter

import pytest
from django.db import connection, connections

from cairnq_django import enqueue_many
from tests.workerutil import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="a PostgreSQL fleet"),
]

TASKS = 20_000
WORKERS = 16
KILLS = 4
CONCURRENCY = 4
LEASE_MS = 3_000
# Generous bounds, never expected to be reached: a stuck fleet fails here.
DRAIN_DEADLINE_S = 400
STARTUP_TIMEOUT_S = 120

_STARTED = re.compile(r"cairnq worker (worker_\w+) starting")


def _query(sql, params=()):
    with connections["default"].cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def _succeeded() -> int:
    return _query("SELECT COUNT(*) FROM cairnq_tasks WHERE status = 'succeeded'")[0][0]


class FleetWorker:
    def __init__(self, env):
        self.process = WorkerProcess(
            env, "--lease", str(LEASE_MS), "--concurrency", str(CONCURRENCY), "-v", "2"
        )
        self.worker_id = None

    def started(self) -> bool:
        if self.worker_id is None:
            match = _STARTED.search(self.process.output())
            if match:
                self.worker_id = match.group(1)
        return self.worker_id is not None

    def held(self) -> set[str]:
        return {row[0] for row in _query(
            "SELECT id FROM cairnq_tasks WHERE status = 'running' AND worker_id = %s",
            [self.worker_id],
        )}


def _enqueue(count: int) -> None:
    batch = 2_000
    for start in range(0, count, batch):
        enqueue_many(
            {"name": "tests.journal", "payload": {"i": i}, "max_attempts": 20}
            for i in range(start, min(count, start + batch))
        )


def test_sixteen_workers_drain_twenty_thousand_tasks_through_kills(live_store, child_env):
    journal = tempfile.NamedTemporaryFile(prefix="cairnq-fleet-", suffix=".txt", delete=False)
    journal.close()
    env = dict(child_env, CAIRNQ_TEST_JOURNAL=journal.name)
    _enqueue(TASKS)
    workers = [FleetWorker(env) for _ in range(WORKERS)]
    everyone = list(workers)
    killed: dict[str, set[str]] = {}  # worker id -> tasks it held when killed
    try:
        for worker in workers:
            wait_for(worker.started, timeout=STARTUP_TIMEOUT_S, interval=0.1,
                     message="A fleet worker never started.")
        started = time.monotonic()
        wait_for(lambda: _succeeded() >= TASKS // 4, timeout=DRAIN_DEADLINE_S, interval=0.2,
                 message="The fleet did not drain a quarter of the tasks.")
        for index in range(KILLS):
            victim = workers[index]
            # Kill it while it holds work, so the kill has something to lose.
            wait_for(victim.held, timeout=60, interval=0.01,
                     message="A worker to be killed never held a task.")
            held = victim.held()
            victim.process.signal(signal.SIGKILL)
            victim.process.wait(30)
            # A claim it had sent may still commit after its death (see
            # test_sigkill_storm), so look again for a moment.
            for _ in range(10):
                time.sleep(0.1)
                held |= victim.held()
            killed[victim.worker_id] = held
            workers[index] = FleetWorker(env)
            everyone.append(workers[index])
        wait_for(lambda: _succeeded() >= TASKS, timeout=DRAIN_DEADLINE_S, interval=0.5,
                 message="The fleet did not drain all the tasks.")
        duration = time.monotonic() - started
        for worker in workers:
            wait_for(worker.started, timeout=STARTUP_TIMEOUT_S, interval=0.1,
                     message="A replacement worker never started.")
            worker.process.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.process.wait(60) == 0, worker.process.output()[-5000:]
    finally:
        for worker in everyone:
            worker.process.stop()
    with open(journal.name) as f:
        runs = [tuple(line.split()) for line in f if line.strip()]
    os.unlink(journal.name)

    rows = _query("SELECT id, status, attempt, worker_id FROM cairnq_tasks")
    print(
        f"\nFleet: {TASKS} tasks, {WORKERS} workers x {CONCURRENCY}, {KILLS} killed and replaced;"
        f" drained in {duration:.1f}s ({TASKS / duration:.0f} tasks/s);"
        f" {len(runs)} runs ended, {sum(a - 1 for _, _, a, _ in rows)} re-runs;"
        f" killed workers held {sum(len(h) for h in killed.values())} tasks"
    )
    assert len(killed) == KILLS
    # Nothing lost.
    assert len(rows) == TASKS
    assert Counter(status for _, status, _, _ in rows) == {"succeeded": TASKS}
    # No attempt ran to its end twice.
    per_attempt = Counter((task_id, int(attempt)) for task_id, attempt, _ in runs)
    assert not [key for key, n in per_attempt.items() if n > 1], "an attempt ran twice"
    # The attempt that succeeded is one its worker journaled.
    ran = {(task_id, int(attempt), owner) for task_id, attempt, owner in runs}
    assert {(task_id, attempt, owner) for task_id, _, attempt, owner in rows} <= ran
    # Only what a killed worker held was run again.
    held_by_the_dead = set().union(*killed.values())
    assert {task_id for task_id, _, attempt, _ in rows if attempt > 1} <= held_by_the_dead
