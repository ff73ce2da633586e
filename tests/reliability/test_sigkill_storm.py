"""A SIGKILL storm: worker processes killed every few seconds lose nothing.

Three real `cairnq_worker` processes drain a few thousand short tasks while
one of them, picked at random, is SIGKILLed every 1-3 s and replaced at once.
Each task records its run in the runs table just before it returns. After
every kill the test notes which tasks the dead worker held (`running` under
its id): only those may run again, once per kill that interrupted them, and
they must leave the dead lease behind once it expires. It keeps looking for
a while after the kill: on PostgreSQL a claim the worker had sent when it
died still commits (the server finishes the statement before it notices the
client is gone), so a dead worker can come to hold tasks after its death.

Checked at the end: every task succeeded (none lost, failed or stuck), no
(task, attempt) ran to its end twice, every re-run follows a kill that
interrupted that task, and every run that did not complete its task belongs
to a killed worker. The figures are printed (pytest -s shows them).
"""

import random
import re
import signal
import statistics
import time
from collections import Counter

import pytest
from django.db import connections

from cairnq_django import enqueue_many
from tests.workerutil import WorkerProcess, runs, wait_for

pytestmark = pytest.mark.slow

TASKS = 3_000
WORKERS = 3
CONCURRENCY = 4
LEASE_MS = 2_000
TASK_SECONDS = 0.05
KILL_EVERY_S = (1.0, 3.0)
# How long after a kill the dead worker's id is still looked for in `running`
# rows: past its last lease, and past any claim it left in flight.
WATCH_DEAD_S = 2 * LEASE_MS / 1000 + 5
MAX_KILLS = 25
# Generous bounds, never expected to be reached: a stuck storm fails here.
STORM_DEADLINE_S = 420
STARTUP_TIMEOUT_S = 90

_STARTED = re.compile(r"cairnq worker (worker_\w+) starting")


class StormWorker:
    """One worker process and the id it announced at start-up."""

    def __init__(self, env):
        self.process = WorkerProcess(
            env, "--lease", str(LEASE_MS), "--poll", "100",
            "--concurrency", str(CONCURRENCY), "-v", "2",
            settings={"RETRY_BACKOFF_BASE": 0},
        )
        self.worker_id = None

    def started(self) -> bool:
        if self.worker_id is None:
            match = _STARTED.search(self.process.output())
            if match:
                self.worker_id = match.group(1)
        return self.worker_id is not None

    def warnings(self) -> list[str]:
        return [
            line for line in self.process.output().splitlines()
            if "lost its lease" in line or "heartbeat ran" in line
            or "recovered from an error" in line
        ]


def _query(sql, params=()):
    with connections["default"].cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def _held_by(worker_id):
    return {row[0] for row in _query(
        "SELECT id FROM cairnq_tasks WHERE status = 'running' AND worker_id = %s", [worker_id]
    )}


def _still_on_dead_lease(pending):
    """The ids in `pending` ({id: dead worker id}) that are still running under it."""
    if not pending:
        return set()
    marks = ", ".join(["%s"] * len(pending))
    rows = _query(
        f"SELECT id, status, worker_id FROM cairnq_tasks WHERE id IN ({marks})", list(pending)
    )
    return {i for i, status, owner in rows if status == "running" and owner == pending[i]}


def test_sigkill_storm_loses_nothing_and_completes_nothing_twice(
    live_store, child_env, runs_table
):
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    enqueue_many(
        {"name": "tests.sleep", "payload": {"seconds": TASK_SECONDS, "record": True},
         "max_attempts": 50}
        for _ in range(TASKS)
    )
    workers = [StormWorker(child_env) for _ in range(WORKERS)]
    everyone = list(workers)
    killed_ids = set()
    interrupted = Counter()  # task id -> kills that caught it running
    caught = set()  # (task id, dead worker id) already counted
    recent = {}  # dead worker id -> when it was killed, while watched
    pending = {}  # task id -> dead worker id, until it leaves that lease
    kill_times = {}  # task id -> monotonic time of the kill that caught it
    recovery_s = []
    kills = 0
    started = time.monotonic()
    try:
        for worker in workers:
            wait_for(worker.started, timeout=STARTUP_TIMEOUT_S, interval=0.1,
                     message="A storm worker never started.")
        next_kill = time.monotonic() + rng.uniform(*KILL_EVERY_S)
        while True:
            now = time.monotonic()
            assert now - started < STORM_DEADLINE_S, (
                f"The storm did not finish in {STORM_DEADLINE_S}s: "
                f"{_query('SELECT status, COUNT(*) FROM cairnq_tasks GROUP BY status')}"
            )
            for dead, killed_at in list(recent.items()):
                if now - killed_at > WATCH_DEAD_S:
                    del recent[dead]
                    continue
                # What a dead worker holds is exactly what its kill interrupted.
                for task_id in _held_by(dead) - {t for t, w in caught if w == dead}:
                    caught.add((task_id, dead))
                    interrupted[task_id] += 1
                    pending[task_id] = dead
                    kill_times[task_id] = killed_at
            for task_id in set(pending) - _still_on_dead_lease(pending):
                recovery_s.append(now - kill_times.pop(task_id))
                del pending[task_id]
            [(done,)] = _query("SELECT COUNT(*) FROM cairnq_tasks WHERE status = 'succeeded'")
            if done == TASKS and not pending and not recent:
                break
            ready = [i for i, worker in enumerate(workers) if worker.started()]
            if kills < MAX_KILLS and done < TASKS and now >= next_kill and ready:
                index = rng.choice(ready)
                victim = workers[index]
                victim.process.signal(signal.SIGKILL)
                victim.process.wait(30)
                kills += 1
                killed_ids.add(victim.worker_id)
                recent[victim.worker_id] = time.monotonic()
                workers[index] = StormWorker(child_env)
                everyone.append(workers[index])
                next_kill = time.monotonic() + rng.uniform(*KILL_EVERY_S)
            time.sleep(0.1)
        duration = time.monotonic() - started
        for worker in workers:
            wait_for(worker.started, timeout=STARTUP_TIMEOUT_S, interval=0.1,
                     message="A replacement worker never started.")
        for worker in workers:
            worker.process.signal(signal.SIGTERM)
        for worker in workers:
            assert worker.process.wait(60) == 0, worker.process.output()[-5000:]
        warnings = [line for worker in everyone for line in worker.warnings()]
    finally:
        for worker in everyone:
            worker.process.stop()

    rows = _query("SELECT id, status, attempt, worker_id FROM cairnq_tasks")
    recorded = runs("slept")
    reruns = sum(attempt - 1 for _, _, attempt, _ in rows)
    print(
        f"\nSIGKILL storm (seed {seed}, {connections['default'].vendor}): {TASKS} tasks, "
        f"{WORKERS} workers x {CONCURRENCY}, lease {LEASE_MS} ms, {kills} kills in "
        f"{duration:.1f}s ({len(everyone)} worker processes in all); "
        f"{sum(interrupted.values())} task runs interrupted by a kill, {reruns} re-runs; "
        f"recovered from a dead lease after median "
        f"{statistics.median(recovery_s) if recovery_s else 0:.2f}s, "
        f"max {max(recovery_s, default=0):.2f}s; {len(warnings)} lease/heartbeat warnings"
    )
    assert kills >= 3, "the storm was too short to kill anything much"
    # Nothing lost: every task ran to success, exactly once per attempt.
    assert len(rows) == TASKS
    assert Counter(status for _, status, _, _ in rows) == {"succeeded": TASKS}
    per_attempt = Counter((task_id, attempt) for task_id, _, attempt, _ in recorded)
    assert not [key for key, n in per_attempt.items() if n > 1], "an attempt ran twice"
    # The attempt that succeeded is the one recorded by its worker.
    final = {(task_id, attempt, owner) for task_id, _, attempt, owner in rows}
    ran = {(task_id, attempt, owner) for task_id, owner, attempt, _ in recorded}
    assert final <= ran
    # Re-runs only where a kill interrupted the task, once per such kill, and
    # every run that did not finish its task was a killed worker's.
    rerun_without_kill = {
        task_id: (attempt, interrupted[task_id])
        for task_id, _, attempt, _ in rows if attempt - 1 > interrupted[task_id]
    }
    assert not rerun_without_kill, (rerun_without_kill, warnings[:20])
    assert reruns <= sum(interrupted.values())
    unfinished = ran - final
    assert {owner for _, _, owner in unfinished} <= killed_ids


def test_storm_helpers_see_only_running_rows(live_store):
    # The bookkeeping above relies on these two reads; keep them honest.
    [row] = enqueue_many([("tests.sleep", {"seconds": 0})])
    [claimed] = live_store.claim(queues=["default"], worker_id="worker_dead", lease_ms=60_000)
    assert claimed.id == row.id
    assert _held_by("worker_dead") == {row.id}
    assert _still_on_dead_lease({row.id: "worker_dead"}) == {row.id}
    live_store.complete(row.id, "worker_dead", None)
    assert _held_by("worker_dead") == set()
    assert _still_on_dead_lease({row.id: "worker_dead"}) == set()
