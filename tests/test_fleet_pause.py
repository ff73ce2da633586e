"""Pause across a fleet: 3 real worker processes, a steady producer, two queues.

The producer enqueues to `mail` and `bulk` throughout. Once both flow,
`mail` is paused. From the moment pause_queue returns, no task of `mail` may
start except those already running then (checked continuously from the rows,
and afterwards from the start times the handler journals), while `bulk` keeps
starting new tasks and `mail` keeps accepting enqueues. Resumed, `mail`
drains: everything enqueued during the pause starts after the resume and
succeeds. Nothing here is timed beyond "eventually, within a generous bound".
"""

from __future__ import annotations

import os
import re
import tempfile
import time

import pytest
from django.db import connections

from cairnq_django import enqueue, pause_queue, resume_queue
from tests.workerutil import WorkerProcess, wait_for

pytestmark = pytest.mark.slow

WORKERS = 3
QUEUES = ("mail", "bulk")
HOLD_S = 0.02  # each task runs a moment, so some are running when the pause lands
TICK_S = 0.03  # the producer's pace: one task per queue per tick
GENEROUS_S = 120

_STARTED = re.compile(r"cairnq worker worker_\w+ starting")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _ids(queue: str, status: str) -> set[str]:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT id FROM cairnq_tasks WHERE queue = %s AND status = %s", [queue, status]
        )
        return {row[0] for row in cursor.fetchall()}


def _unfinished() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM cairnq_tasks WHERE status <> 'succeeded'")
        return cursor.fetchone()[0]


def _starts(journal: str) -> dict[str, int]:
    """Task id -> when its handler started (host clock, ms), from the journal."""
    with open(journal) as lines:
        return {task_id: int(ms) for task_id, ms in (line.split() for line in lines)}


class Producer:
    """Enqueues one task per queue per tick, while the test watches between ticks."""

    def __init__(self) -> None:
        self.enqueued: dict[str, list[str]] = {queue: [] for queue in QUEUES}

    def run(self, seconds: float, check=None) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for queue in QUEUES:
                task = enqueue("tests.stamp", {"hold_s": HOLD_S}, queue=queue)
                self.enqueued[queue].append(task.id)
            if check is not None:
                check()
            time.sleep(TICK_S)

    def until(self, predicate, message: str) -> None:
        """Keep producing until `predicate()` holds (generous bound)."""
        deadline = time.monotonic() + GENEROUS_S
        while not predicate():
            assert time.monotonic() < deadline, message
            self.run(0.2)


def test_a_paused_queue_is_held_while_the_other_flows_and_drains_on_resume(
    live_store, child_env
):
    journal = tempfile.NamedTemporaryFile(prefix="cairnq-pause-", suffix=".txt", delete=False)
    journal.close()
    env = dict(child_env, CAIRNQ_TEST_JOURNAL=journal.name)
    workers = [
        WorkerProcess(env, "-q", "mail", "-q", "bulk", "--concurrency", "2", "-v", "2")
        for _ in range(WORKERS)
    ]
    producer = Producer()
    try:
        for worker in workers:
            wait_for(lambda w=worker: _STARTED.search(w.output()), timeout=GENEROUS_S,
                     message="A worker never started.")
        producer.until(
            lambda: all(set(producer.enqueued[q]) & set(_starts(journal.name)) for q in QUEUES),
            "The fleet never started tasks of both queues.",
        )

        assert pause_queue("mail", by="test") is True
        paused_at = _now_ms()
        running_at_pause = _ids("mail", "running")
        enqueued_before = len(producer.enqueued["mail"])

        def nothing_new_runs() -> None:
            extra = _ids("mail", "running") - running_at_pause
            assert not extra, f"claimed from the paused queue: {sorted(extra)}"

        producer.run(2.0, check=nothing_new_runs)
        producer.until(
            lambda: any(
                ms > paused_at for task_id, ms in _starts(journal.name).items()
                if task_id in set(producer.enqueued["bulk"])
            ),
            "The other queue stopped flowing while mail was paused.",
        )
        nothing_new_runs()
        held = producer.enqueued["mail"][enqueued_before:]
        assert held, "the producer enqueued nothing to mail during the pause"
        assert set(held) <= _ids("mail", "queued"), "an enqueue to the paused queue was lost"
        starts = _starts(journal.name)
        late = {
            task_id for task_id in producer.enqueued["mail"]
            if starts.get(task_id, 0) > paused_at and task_id not in running_at_pause
        }
        assert not late, f"tasks of the paused queue started after the pause: {sorted(late)}"

        resumed_at = _now_ms()
        assert resume_queue("mail", by="test") is True
        producer.run(0.5)
        wait_for(lambda: _unfinished() == 0, timeout=GENEROUS_S, interval=0.1,
                 message="The resumed queue did not drain.")
        starts = _starts(journal.name)
        assert all(starts[task_id] >= resumed_at for task_id in held)
        assert all(task_id in starts for queue in QUEUES for task_id in producer.enqueued[queue])
    finally:
        for worker in workers:
            worker.stop()
        os.unlink(journal.name)
