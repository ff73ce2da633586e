"""An idle worker wakes when delayed work falls due, not at its next rare poll (docs/wakeups.md).

The worker processes here poll a minute apart (five on PostgreSQL with a
healthy listener), so a delayed task or a retry that runs at all within the
tests' generous waits was claimed for its due time. The worker's own debug
log says why each idle sleep ended; the tests read it rather than the clock.
"""

from __future__ import annotations

import time

import pytest

from cairnq_django import enqueue, get, pause_queue
from cairnq_django.worker.due import DueTimes
from tests.workerutil import WorkerProcess, wait_for

# Polls far apart: nothing but a due-time wake (or a NOTIFY) ends an idle sleep
# within the tests' waits.
RARE_POLLS = {"POLL_INTERVAL": 60_000}
DUE_WAKE = "falling due"
POLL_WAKE = "its poll interval ran out"


# ------------------------------------------------------------ the due times
def test_a_read_due_time_counts_only_for_a_worker_that_answers_new_work():
    due = DueTimes()
    due.read(2_000, sent=10.0, received=10.2)
    # Halfway through the round trip, plus the millisecond margin.
    assert due.next(answers=True) == pytest.approx(12.101)
    assert due.next(answers=False) is None  # a standby leaves it to the seated workers
    due.read(None, sent=11.0, received=11.0)
    assert due.next(answers=True) is None


def test_its_own_requeues_count_for_any_worker_and_the_earliest_wins():
    due = DueTimes()
    due.requeued(None)
    due.requeued(20.0)
    due.requeued(15.0)
    due.requeued(30.0)
    assert due.next(answers=False) == 15.0
    due.read(1_000, sent=13.0, received=13.0)
    assert due.next(answers=True) == pytest.approx(14.001)


def test_spending_answers_every_moment_up_to_now_and_the_same_task_read_twice():
    due = DueTimes()
    due.read(0, sent=10.0, received=10.0)
    due.requeued(10.03)  # the same retry, as the call's end saw it a moment later
    assert due.spend(10.01) is False
    assert due.next(answers=True) is None
    due.requeued(20.0)
    due.read(30_000, sent=10.0, received=10.0)
    assert due.spend(20.0) is True
    assert due.next(answers=True) == pytest.approx(40.001)


# ------------------------------------------------------------------ the probe
def test_the_idle_probe_says_when_the_next_task_of_its_names_falls_due(store):
    assert store.probe_idle(queues=["default"], names=["t"]).due_in_ms is None
    store.submit("t", delay_ms=60_000)
    store.submit("t", delay_ms=30_000)
    store.submit("other", delay_ms=1_000)  # another worker's name
    store.submit("t", queue="elsewhere", delay_ms=1_000)  # a queue it does not serve
    probe = store.probe_idle(queues=["default"], names=["t"])
    assert not probe.work
    assert probe.due_in_ms is not None and 20_000 < probe.due_in_ms <= 30_000
    assert store.probe_idle(queues=["default"], names=[]).due_in_ms is None


def test_the_idle_probe_still_finds_due_work_and_skips_paused_queues(store):
    store.submit("t")
    store.submit("t", delay_ms=30_000)
    probe = store.probe_idle(queues=["default"], names=["t"])
    assert probe.work and probe.due_in_ms is not None
    pause_queue("default")
    probe = store.probe_idle(queues=["default"], names=["t"])
    assert not probe.work and probe.due_in_ms is None


# ------------------------------------------------------------ worker processes
def _idle_worker(child_env, settings: dict) -> WorkerProcess:
    worker = WorkerProcess(
        child_env, "--concurrency", "1", "-v", "3", "--no-scheduler", settings=settings
    )
    wait_for(lambda: "starting" in worker.output(), timeout=90)
    return worker


def _workers_recorded() -> int:
    from django.db import connections

    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_django_workers")
        return cursor.fetchone()[0]


@pytest.mark.slow
def test_a_delayed_task_enqueued_while_the_worker_idles_runs_at_its_due_time(live_store, child_env):
    worker = _idle_worker(child_env, RARE_POLLS)
    try:
        # The row is written after the first poll; the worker is then asleep
        # (a moment more, so the enqueue below lands in its sleep).
        wait_for(lambda: _workers_recorded() == 1, timeout=60)
        time.sleep(1.0)
        task = enqueue("tests.echo", {"n": 1}, delay=1_500)
        done = wait_for(lambda: get(task.id).status == "succeeded" and get(task.id), timeout=40)
        out = worker.output()
    finally:
        worker.stop()
    assert done.attempt == 1
    # Told of the task (NOTIFY, or the SQLite change signal), it read the due
    # time and woke for it; its poll interval never ran out.
    assert "woke for a delayed task it read falling due" in out, out
    assert POLL_WAKE not in out, out


@pytest.mark.slow
@pytest.mark.parametrize("name, payload", [
    ("tests.flaky", {"succeed_on": 2}),
    ("tests.snooze", {"times": 1, "delay": 1.0}),
])
def test_a_worker_wakes_for_its_own_retry_or_snooze_with_no_other_signal(
    live_store, child_env, runs_table, name, payload
):
    # No wakeups at all: only the worker's own knowledge of the requeue can
    # bring the second attempt before the one-minute poll.
    settings = {**RARE_POLLS, "WAKEUPS": False, "RETRY_BACKOFF_BASE": 1_000}
    task = enqueue(name, payload)  # found by the worker's first poll
    worker = _idle_worker(child_env, settings)
    try:
        done = wait_for(lambda: get(task.id).status == "succeeded" and get(task.id), timeout=40)
        out = worker.output()
    finally:
        worker.stop()
    assert done.result.get("attempt") == (2 if name == "tests.flaky" else 1)
    # Its own requeue, or the probe it ran as the call ended (no wakeups: a
    # call ending is a reason to look), told it the moment.
    assert DUE_WAKE in out, out
    assert POLL_WAKE not in out, out
