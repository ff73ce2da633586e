"""The heartbeat against a real database: settling races and late beats.

The race tests drive a Heartbeat and a settling write directly, holding the
settling thread at the point where its write has committed but the context
does not yet know it, then beat. That moment used to be reported as a lost
lease for a task that had just succeeded.
"""

import logging
import threading
import time

import pytest
from django.db import connections, transaction

import cairnq_django
from cairnq_django import CairnQError, HeartbeatLate, enqueue, get
from cairnq_django.worker import Registry, TaskContext, Worker
from cairnq_django.worker.execution import Call, Execution
from cairnq_django.worker.heartbeat import Heartbeat
from cairnq_django.worker.registry import Registration
from tests.storeutil import sql

LEASE_MS = 30_000
WORKER = "worker_heartbeat_test"


@pytest.fixture
def claimed(live_store):
    """A task claimed by WORKER, and its context."""
    enqueue("hb.task", {"n": 1})
    # Claimed for less than the heartbeat's lease, so a renewal shows.
    [row] = live_store.claim(queues=["default"], worker_id=WORKER, lease_ms=LEASE_MS // 3)
    return TaskContext(store=live_store, task=row, worker_id=WORKER, lease_ms=LEASE_MS)


def heartbeat_for(store, ctx, errors):
    return Heartbeat(
        store=store, worker_id=WORKER, lease_ms=LEASE_MS, in_flight=lambda: [ctx],
        report=lambda exc, **context: errors.append((exc, context)),
    )


class Pause:
    """Hold a thread at one point until the test lets it go on."""

    def __init__(self):
        self.reached = threading.Event()
        self.go_on = threading.Event()

    def __call__(self):
        self.reached.set()
        assert self.go_on.wait(30), "the test never released the paused thread"


def in_thread(fn):
    """Run fn on a thread with its own connection; return (thread, outcome dict)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # reported to the test through `outcome`
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def beat_inside_the_window(store, ctx, pause, thread, caplog):
    """Beat while the settling thread waits right after its commit; let it finish."""
    errors = []
    assert pause.reached.wait(30), "the settling write never committed"
    try:
        with caplog.at_level(logging.WARNING, logger="cairnq_django.worker"):
            heartbeat_for(store, ctx, errors).beat()
    finally:
        pause.go_on.set()
        thread.join(30)
    assert not thread.is_alive()
    return errors


def assert_not_lost(ctx, errors, caplog):
    assert not ctx.lost_lease
    assert errors == []
    assert not [r for r in caplog.records if "lost its lease" in r.getMessage()]


def test_completion_committed_before_the_context_knows_is_not_a_lost_lease(
    live_store, claimed, caplog
):
    ctx, pause = claimed, Pause()

    def write_completion(task_id, worker_id, result):
        row = live_store.complete(task_id, worker_id, result)  # committed (autocommit)
        pause()
        return row

    execution = Execution(
        worker=object(), store=live_store, on_done=lambda call: None,
        report=lambda exc, **context: None, write_completion=write_completion,
    )
    call = Call(
        registration=Registration(name="hb.task", fn=lambda ctx, payload: None, is_async=False),
        contexts=[ctx],
    )
    thread, outcome = in_thread(lambda: execution.finish_returned(call, {"done": True}))
    errors = beat_inside_the_window(live_store, ctx, pause, thread, caplog)
    assert "error" not in outcome, outcome
    assert_not_lost(ctx, errors, caplog)
    assert ctx.settlement.settled and ctx.settlement.final.status == "succeeded"
    assert get(ctx.task_id).status == "succeeded"


class PausingStore:
    """The store, except that fail() pauses after its write committed."""

    def __init__(self, store, pause):
        self._store, self._pause = store, pause

    def fail(self, *args, **kwargs):
        row = self._store.fail(*args, **kwargs)
        self._pause()
        return row

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_a_retry_committed_before_the_context_knows_is_not_a_lost_lease(
    live_store, claimed, caplog
):
    # A retryable fail requeues the row (worker_id cleared), so it is just as
    # absent from the heartbeat's answer as a stolen one.
    pause = Pause()
    ctx = TaskContext(
        store=PausingStore(live_store, pause), task=claimed.record, worker_id=WORKER,
        lease_ms=LEASE_MS, retry_backoff_base_ms=0,
    )
    thread, outcome = in_thread(lambda: ctx.fail("try again"))
    errors = beat_inside_the_window(live_store, ctx, pause, thread, caplog)
    assert "error" not in outcome, outcome
    assert_not_lost(ctx, errors, caplog)
    assert ctx.settlement.settled and get(ctx.task_id).status == "queued"


def test_an_atomic_completion_committed_before_the_context_knows_is_not_a_lost_lease(
    live_store, claimed, caplog
):
    ctx, pause = claimed, Pause()

    def complete_atomically():
        with ctx.atomic() as done:
            # Runs after the commit, before ctx.atomic() marks the context settled.
            transaction.on_commit(pause, using=live_store.using)
            done.result = {"atomic": True}

    thread, outcome = in_thread(complete_atomically)
    errors = beat_inside_the_window(live_store, ctx, pause, thread, caplog)
    assert "error" not in outcome, outcome
    assert_not_lost(ctx, errors, caplog)
    assert ctx.settlement.settled and get(ctx.task_id).status == "succeeded"


def test_a_task_taken_over_meanwhile_is_still_flagged_lost(live_store, claimed, caplog):
    ctx, errors = claimed, []
    sql(
        live_store.using,
        "UPDATE cairnq_tasks SET worker_id = 'worker_thief' WHERE id = %s",
        [ctx.task_id],
    )
    with caplog.at_level(logging.WARNING, logger="cairnq_django.worker"):
        heartbeat_for(live_store, ctx, errors).beat()
    assert ctx.lost_lease
    assert f"Task hb.task {ctx.task_id} lost its lease" in caplog.text


def test_a_settle_that_fails_leaves_a_later_loss_detectable(live_store, claimed, caplog):
    # The settling flag is dropped when the write raises, so a real loss after
    # a failed completion is still flagged.
    ctx, errors = claimed, []

    def broken_write():
        raise RuntimeError("the database went away")

    with pytest.raises(RuntimeError):
        ctx.settlement.complete(broken_write, by_worker=True)
    assert not ctx.settlement.settled_or_settling()
    sql(
        live_store.using,
        "UPDATE cairnq_tasks SET worker_id = 'worker_thief' WHERE id = %s",
        [ctx.task_id],
    )
    heartbeat_for(live_store, ctx, errors).beat()
    assert ctx.lost_lease


def _gil_hog_size(seconds: float) -> int:
    """How big a sum(range(n)) holds the GIL for about `seconds` here."""
    started = time.perf_counter()
    sum(range(5_000_000))
    per_item = (time.perf_counter() - started) / 5_000_000
    return max(10_000_000, int(seconds / per_item))


def test_a_late_heartbeat_reaches_on_error_as_heartbeat_late(live_store, caplog):
    # sum() over a range is one C call that never releases the GIL: the
    # heartbeat thread cannot run until it returns. ~1.5 s is well over two
    # 200 ms intervals, so at least one beat comes more than an interval late.
    n = _gil_hog_size(1.5)
    reg = Registry()
    reg.register("hb.gil_hog", lambda ctx, payload: sum(range(payload["n"])))
    errors = []
    task = enqueue("hb.gil_hog", {"n": n}, max_attempts=1)
    # The lease expires during the hog. With a short poll the claim loop's next
    # claim could recover the expired task before the late beat looks at what
    # is in flight, leaving it nothing at risk to report; a long poll keeps the
    # loop asleep until the call ends (burst mode wakes on that).
    worker = Worker(
        registry=reg, burst=True, lease_ms=600, poll_ms=10_000,
        on_error=lambda exc, context: errors.append((exc, context)),
    )
    with caplog.at_level(logging.WARNING, logger="cairnq_django.worker"):
        worker.run()
    # A beat late before the claim (a loaded machine) has no task at risk.
    late = [
        (exc, context) for exc, context in errors
        if isinstance(exc, HeartbeatLate) and exc.task_ids
    ]
    assert late, errors
    exc, context = late[0]
    assert isinstance(exc, CairnQError)
    assert cairnq_django.HeartbeatLate is HeartbeatLate
    assert context["phase"] == "execute"
    assert context["worker_id"] == worker.worker_id
    assert exc.interval_ms == 200 and exc.lease_ms == 600
    assert exc.late_ms > exc.interval_ms
    assert exc.task_ids == [task.id] and context["task_ids"] == [task.id]
    assert "The heartbeat ran" in caplog.text and "held the GIL" in caplog.text
    assert exc.cause == "cpu"
    # Logged once as the heartbeat's warning, not again as a recovered error.
    assert not [
        r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], HeartbeatLate)
    ]
    assert get(task.id).status in ("succeeded", "failed")


postgres_only = pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="PostgreSQL row locks and WAL flushes"
)


@postgres_only
def test_a_beat_does_not_wait_behind_rows_its_settler_is_committing(live_store, caplog):
    # Two tasks in flight; the settler is committing the first, whose row
    # stays locked until that commit is flushed. The beat renews the second
    # without queueing on the first's lock, and does not call the first lost.
    enqueue("hb.task", {"n": 1})
    enqueue("hb.task", {"n": 2})
    rows = live_store.claim(
        queues=["default"], worker_id=WORKER, lease_ms=LEASE_MS // 3, limit=2
    )
    settling, running = (
        TaskContext(store=live_store, task=row, worker_id=WORKER, lease_ms=LEASE_MS)
        for row in rows
    )
    locked, release = threading.Event(), threading.Event()

    def hold_the_row_lock():
        with transaction.atomic():
            sql(
                live_store.using,
                "UPDATE cairnq_tasks SET updated_at_ms = updated_at_ms WHERE id = %s",
                [settling.task_id],
            )
            locked.set()
            release.wait(60)

    holder, _ = in_thread(hold_the_row_lock)
    errors = []
    heartbeat = Heartbeat(
        store=live_store, worker_id=WORKER, lease_ms=LEASE_MS,
        in_flight=lambda: [settling, running],
        report=lambda exc, **context: errors.append(exc),
        committing=lambda: {settling.task_id},
    )
    try:
        assert locked.wait(30)
        before = get(running.task_id).lease_until_ms
        beat, outcome = in_thread(heartbeat.beat)
        beat.join(20)
        # Finished while the row was still locked: it did not wait for it.
        assert not beat.is_alive(), "the beat queued behind the settler's row lock"
    finally:
        release.set()
        holder.join(30)
        beat.join(30)
    assert "error" not in outcome and errors == []
    assert get(running.task_id).lease_until_ms > before
    assert not settling.lost_lease and not running.lost_lease


@postgres_only
def test_a_renewal_on_postgres_does_not_wait_for_its_wal_flush(live_store, claimed):
    from django.test.utils import CaptureQueriesContext

    errors = []
    before = get(claimed.task_id).lease_until_ms
    with CaptureQueriesContext(connections["default"]) as queries:
        heartbeat_for(live_store, claimed, errors).beat()
    sql = [q["sql"] for q in queries.captured_queries]
    assert "SET LOCAL synchronous_commit TO OFF" in sql, sql
    assert get(claimed.task_id).lease_until_ms > before
    assert errors == [] and not claimed.lost_lease


def test_a_completion_written_elsewhere_is_waited_for_by_the_next_lock_holder(
    live_store, claimed
):
    """begin_completion: the settling write runs on another thread, and the
    context's lock makes an abandon (shutdown) wait for its outcome, as it
    waited for the handler thread that used to hold the lock through it."""
    ctx = claimed
    assert ctx.settlement.begin_completion()
    assert ctx.settlement.settled_or_settling()  # a heartbeat finding the row gone is not a lost lease
    assert not ctx.settlement.mark_lost_unless_settling()
    abandon, outcome = in_thread(
        lambda: ctx.settlement.abandon({"code": "shutdown", "message": "stop"}, delay_ms=0)
    )
    time.sleep(0.2)
    assert abandon.is_alive()  # waiting for the completion's outcome
    row = live_store.complete(ctx.task_id, WORKER, {"done": True})
    ctx.settlement.end_completion(row)
    abandon.join(30)
    assert outcome.get("value", "missing") is None, outcome  # already settled: nothing written
    assert ctx.settlement.settled and ctx.settlement.final.status == "succeeded"
    assert get(ctx.task_id).status == "succeeded"
    assert not ctx.settlement.begin_completion()  # settled: nothing left to complete


def test_a_completion_written_elsewhere_that_lost_its_lease_flags_the_context(
    live_store, claimed
):
    ctx = claimed
    assert ctx.settlement.begin_completion()
    ctx.settlement.end_completion(None, lost=True)
    assert ctx.lost_lease and not ctx.settlement.settled and not ctx.settlement.settled_or_settling()
    assert ctx.wait_lost_lease(0)
    assert ctx.settlement.fail({"code": "x", "message": "y"}, True, by_worker=True) is None


@postgres_only
def test_a_renewal_held_on_a_row_lock_is_blamed_on_the_database_not_the_cpu(
    live_store, caplog, settings
):
    # No statement timeout, so the renewal waits for the lock as long as it is held.
    settings.CAIRNQ = {"WORKER_STATEMENT_TIMEOUT": 0}
    started = threading.Event()
    reg = Registry()
    reg.register("hb.slow", lambda ctx, payload: (started.set(), time.sleep(6)))
    task = enqueue("hb.slow", {}, max_attempts=1)
    errors = []
    worker = Worker(
        registry=reg, burst=True, lease_ms=3_000, poll_ms=10_000,
        on_error=lambda exc, context: errors.append((exc, context)),
    )
    runner = threading.Thread(target=worker.run)
    with caplog.at_level(logging.WARNING, logger="cairnq_django.worker"):
        runner.start()
        assert started.wait(30)
        params = connections["default"].get_connection_params()
        params.pop("cursor_factory", None)
        import psycopg

        with psycopg.connect(**params) as other:
            # The task's row lock, held ~3 s: the next renewal waits on it.
            other.execute("SELECT 1 FROM cairnq_tasks WHERE id = %s FOR UPDATE", [task.id])
            time.sleep(3)
            other.rollback()
        runner.join(60)
    late = [exc for exc, _ in errors if isinstance(exc, HeartbeatLate) and exc.task_ids]
    assert late, errors
    assert late[0].cause == "database", late[0]
    assert late[0].renewal_ms > late[0].interval_ms
    assert "took" in caplog.text and "in the database or on the network" in caplog.text
    assert "held the GIL" not in caplog.text
    assert get(task.id).status == "succeeded"
