"""Snooze: a handler's "not now, again in N seconds", which is neither a failure nor an attempt.

The store's transition and its ownership check against real rows, TaskContext
and Snooze in-process, the worker's signals and log line, a framework task,
the admin, purge and retention; then real worker processes for the outcomes
the issue names (attempts and errors unchanged by any number of snoozes,
max_attempts not consumed, a task that snoozes forever stays visible and
cancelable).
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta

import pytest
from django.db import connections

from cairnq_django import LostLease, Snooze, cancel, compat, enqueue, get, list_tasks, signals
from cairnq_django.models import TaskFlow
from cairnq_django.retention import RetentionSweeper
from cairnq_django.testing import run_tasks
from cairnq_django.worker import Registry, TaskContext, Worker
from tests.storeutil import age, expire_lease, run, shift, sql
from tests.workerutil import WorkerProcess, runs, wait_for

NO_BACKOFF = {"RETRY_BACKOFF_BASE": 0}


def claimed(store, name="snooze.test", worker="w-sn", **submit) -> TaskContext:
    row = run(store, name, worker, **submit)
    return TaskContext(store=store, task=row, worker_id=worker, lease_ms=30_000)


def make_due(store, task_id: str) -> None:
    shift(store, task_id, "run_at_ms", -10 * 60_000)


def claim_again(store, ctx: TaskContext) -> TaskContext:
    make_due(store, ctx.task_id)
    [row] = store.claim(queues=[ctx.queue], worker_id=ctx.worker_id, names=[ctx.name])
    assert row.id == ctx.task_id
    return TaskContext(store=store, task=row, worker_id=ctx.worker_id, lease_ms=30_000)


def snoozes(task_id: str) -> int | None:
    flow = TaskFlow.objects.filter(task_id=task_id).first()
    return None if flow is None else flow.snoozes


# ---------------------------------------------------------------- the store
def test_snooze_requeues_later_giving_the_attempt_back(store):
    ctx = claimed(store)
    assert ctx.attempt == 1
    ctx.progress(0.3, "halfway")

    row = ctx.snooze(30)

    assert row.status == "queued" and row.attempt == 0
    assert row.error is None
    assert row.run_at_ms - row.updated_at_ms == 30_000
    assert row.worker_id is None and row.lease_until_ms is None
    assert row.progress is None and row.message is None  # every path back to queued clears them
    assert row.completed_at_ms is None
    assert store.get(ctx.task_id) == row
    assert snoozes(ctx.task_id) == 1
    assert ctx.settlement.settled and ctx.settlement.snoozed_ms == 30_000
    # Settling twice is a no-op, as for succeed and fail.
    assert ctx.snooze(5) is None and ctx.succeed("late") is None
    assert snoozes(ctx.task_id) == 1


def test_a_timedelta_and_fractions_of_a_second(store):
    ctx = claimed(store)
    row = ctx.snooze(timedelta(minutes=2))
    assert row.run_at_ms - row.updated_at_ms == 120_000
    ctx = claim_again(store, ctx)
    row = ctx.snooze(0.0001)  # rounded up: a positive delay never means "due now"
    assert row.run_at_ms - row.updated_at_ms == 1


def test_five_snoozes_then_success_leave_attempt_one_and_no_error(store):
    ctx = claimed(store)
    for _ in range(5):
        ctx.snooze(1)
        ctx = claim_again(store, ctx)
        assert ctx.attempt == 1
    row = ctx.succeed({"ok": True})
    assert row.status == "succeeded" and row.attempt == 1 and row.error is None
    assert snoozes(ctx.task_id) == 5


def test_a_snooze_keeps_the_error_of_an_earlier_failed_attempt(store):
    ctx = claimed(store)
    failed = ctx.fail("upstream down")
    ctx = claim_again(store, ctx)
    assert ctx.attempt == 2

    row = ctx.snooze(10)

    assert row.attempt == 1
    assert row.error == failed.error  # untouched: the row reads as before this attempt


def test_max_attempts_one_task_snoozing_three_times_still_runs(store):
    ctx = claimed(store, max_attempts=1)
    for _ in range(3):
        ctx.snooze(1)
        ctx = claim_again(store, ctx)
    assert ctx.attempt == 1
    # Its one real attempt is still to come: a retryable failure now uses it up.
    row = ctx.fail("a real failure")
    assert row.status == "failed" and row.attempt == 1


def test_a_snooze_meeting_a_pending_cancel_ends_canceled(store):
    ctx = claimed(store)
    store.cancel(ctx.task_id)

    row = ctx.snooze(30)

    assert row.status == "canceled" and row.attempt == 1
    assert row.completed_at_ms is not None and row.lease_until_ms is None
    assert snoozes(ctx.task_id) is None  # nothing was snoozed


def test_a_snooze_from_a_lease_taken_over_is_refused(store):
    ctx = claimed(store)
    sql(store.using, "UPDATE cairnq_tasks SET worker_id = 'someone-else' WHERE id = %s",
        [ctx.task_id])
    before = store.get(ctx.task_id)

    with pytest.raises(LostLease):
        ctx.snooze(30)

    assert ctx.lost_lease and not ctx.settlement.settled
    assert store.get(ctx.task_id) == before
    assert snoozes(ctx.task_id) is None


def test_a_snooze_from_an_expired_lease_is_refused(store):
    ctx = claimed(store)
    expire_lease(store, ctx.task_id)
    before = store.get(ctx.task_id)
    with pytest.raises(LostLease):
        store.snooze(ctx.task_id, ctx.worker_id, 30_000)
    assert store.get(ctx.task_id) == before and snoozes(ctx.task_id) is None


def test_a_snooze_of_a_task_not_running_is_refused(store):
    task = store.submit("snooze.test")
    with pytest.raises(LostLease):
        store.snooze(task.id, "w-sn", 30_000)
    assert store.get(task.id).status == "queued"


@pytest.mark.parametrize(
    "delay",
    [0, -1, -0.5, math.nan, math.inf, -math.inf, timedelta(0), timedelta(seconds=-3), "30",
     None, True, 2**52],
    ids=repr,
)
def test_bad_delays_are_refused_before_any_write(store, delay):
    ctx = claimed(store)
    with pytest.raises(ValueError, match="snooze delay"):
        ctx.snooze(delay)
    with pytest.raises(ValueError, match="snooze delay"):
        Snooze(delay)
    assert store.get(ctx.task_id).status == "running"
    assert not ctx.settlement.settled and not ctx.lost_lease


@pytest.mark.parametrize("delay_ms", [0, -5, 1.5, 2**52 + 1])
def test_the_store_refuses_a_bad_delay_ms(store, delay_ms):
    ctx = claimed(store)
    with pytest.raises(ValueError, match="delay_ms"):
        store.snooze(ctx.task_id, ctx.worker_id, delay_ms)
    assert store.get(ctx.task_id).status == "running"


def test_a_task_that_snoozes_forever_stays_visible_and_cancelable(store):
    ctx = claimed(store)
    ctx.snooze(timedelta(days=365))

    assert store.claim(queues=["default"], worker_id="w-other") == []
    listed = list_tasks(status="queued", name="snooze.test")
    assert [t.id for t in listed] == [ctx.task_id]
    assert store.stats()["default"]["queued"] == 1

    row = cancel(ctx.task_id)

    assert row.status == "canceled"
    assert snoozes(ctx.task_id) == 1


# ---------------------------------------------------------------- purge
def test_purge_and_retention_take_the_snooze_count_with_the_task(store):
    ids = []
    for _ in range(3):
        ctx = claimed(store)
        ctx.snooze(1)
        ctx = claim_again(store, ctx)
        ctx.succeed()
        age(store, ctx.task_id, 2 * 3_600_000)
        ids.append(ctx.task_id)
    assert TaskFlow.objects.filter(task_id__in=ids).count() == 3

    assert store.purge(older_than_ms=3_600_000, limit=1) == [ids[0]]
    RetentionSweeper(rules=3_600_000, pause_ms=0).sweep_once()

    assert not TaskFlow.objects.filter(task_id__in=ids).exists()


def test_a_peer_deleting_the_task_row_cascades_to_the_snooze_count(store):
    ctx = claimed(store)
    ctx.snooze(1)
    # As another CairnQ implementation purges: plain SQL, nothing of Django's.
    sql(store.using, "DELETE FROM cairnq_tasks WHERE id = %s", [ctx.task_id])
    assert not TaskFlow.objects.filter(task_id=ctx.task_id).exists()


# ---------------------------------------------------------------- in-process worker
@pytest.fixture
def received():
    """Every worker signal sent, as (signal name, task status, extra keyword names)."""
    seen = []
    names = ("task_succeeded", "task_failed", "task_retrying", "task_snoozed", "task_canceled")
    receivers = {}
    for name in names:
        def receiver(sender, worker, task, _name=name, **kwargs):
            seen.append((_name, task.status, kwargs.get("delay_ms")))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def run_in_process(reg: Registry, *task_ids: str) -> None:
    """Run a worker in this process until the tasks are finished, snoozes made due at once."""
    import threading

    worker = Worker(registry=reg, concurrency=2, retry_backoff_base_ms=0, poll_ms=20)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: all(_finished_making_due(i) for i in task_ids), timeout=60,
                 message=f"not finished: {[get(i) for i in task_ids]}")
    finally:
        worker.stop()
        thread.join(30)


def _finished_making_due(task_id: str) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "UPDATE cairnq_tasks SET run_at_ms = 0 WHERE id = %s AND status = 'queued'", [task_id]
        )
    row = get(task_id)
    return row is not None and row.status in ("succeeded", "failed", "canceled")


@pytest.mark.parametrize("how", ["ctx", "raise", "async-ctx", "async-raise"])
def test_the_worker_snoozes_without_failing_or_counting(live_store, received, how, caplog):
    reg = Registry()
    seen = []

    def handler(ctx, payload):
        seen.append(ctx.attempt)
        if len(seen) <= 2:
            if how == "raise":
                raise Snooze(0.5)
            ctx.snooze(0.5)
        return {"attempt": ctx.attempt}

    async def async_handler(ctx, payload):
        seen.append(ctx.attempt)
        if len(seen) <= 2:
            if how == "async-raise":
                raise Snooze(0.5)
            await ctx.asnooze(0.5)
        return {"attempt": ctx.attempt}

    reg.register("sn.job", async_handler if how.startswith("async") else handler)
    task = enqueue("sn.job", {}, max_attempts=1)
    with caplog.at_level(logging.INFO, logger="cairnq_django.worker"):
        run_in_process(reg, task.id)

    row = get(task.id)
    assert row.status == "succeeded" and row.attempt == 1 and row.error is None
    assert row.result == {"attempt": 1}
    assert seen == [1, 1, 1]
    assert snoozes(task.id) == 2
    assert [r for r in received if r[0] != "task_succeeded"] == [
        ("task_snoozed", "queued", 500), ("task_snoozed", "queued", 500),
    ]
    lines = [r for r in caplog.records if "snoozed" in r.getMessage()]
    assert len(lines) == 2
    assert all(r.levelno == logging.INFO for r in lines)
    assert all(
        r.getMessage().startswith(f"Task sn.job {task.id} attempt 1/1 snoozed for 500 ms after ")
        for r in lines
    )
    assert not [r for r in caplog.records if "failed" in r.getMessage()]


def test_a_batch_handler_snoozes_single_contexts(live_store, received):
    reg = Registry()
    seen = set()
    sizes = []

    def handler(ctxs):
        sizes.append(len(ctxs))
        for ctx in ctxs:
            # Odd ones snooze the first time they run, whichever call that is.
            if ctx.payload["i"] % 2 and ctx.task_id not in seen:
                ctx.snooze(0.2)
            seen.add(ctx.task_id)
        return {ctx.task_id: {"i": ctx.payload["i"]} for ctx in ctxs}

    reg.register("sn.batch", handler, batch=4)
    tasks = [enqueue("sn.batch", {"i": i}) for i in range(4)]
    run_in_process(reg, *(t.id for t in tasks))

    rows = [get(t.id) for t in tasks]
    assert [r.result for r in rows] == [{"i": i} for i in range(4)]
    assert all(r.attempt == 1 and r.error is None for r in rows)
    assert [snoozes(t.id) for t in tasks] == [None, 1, None, 1]
    assert max(sizes) > 1  # contexts of one call settled apart


def test_a_batch_handler_raising_snooze_snoozes_what_it_left(live_store):
    reg = Registry()
    calls = []

    def handler(ctxs):
        calls.append(len(ctxs))
        if len(calls) == 1:
            ctxs[0].succeed("done early")
            raise Snooze(0.2)
        return None

    reg.register("sn.batch_raise", handler, batch=3)
    tasks = [enqueue("sn.batch_raise", {"i": i}) for i in range(3)]
    run_in_process(reg, *(t.id for t in tasks))
    counts = sorted(snoozes(t.id) or 0 for t in tasks)
    assert counts == [0, 1, 1]
    assert all(get(t.id).attempt == 1 for t in tasks)


def test_a_bad_delay_fails_the_attempt_as_a_handler_error(live_store):
    reg = Registry()
    reg.register("sn.bad", lambda ctx, payload: ctx.snooze(-1))
    task = enqueue("sn.bad", {}, max_attempts=1)
    run_in_process(reg, task.id)
    row = get(task.id)
    assert row.status == "failed" and row.attempt == 1
    assert row.error["type"] == "ValueError" and row.error["code"] == "handler_error"
    assert "snooze delay must be a positive, finite number of seconds" in row.error["message"]
    assert snoozes(task.id) is None


@pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed")
def test_a_framework_task_snoozes_by_raising(live_store, received):
    from cairnq_django.backends.definitions import known_tasks
    from cairnq_django.backends.handlers import TaskHandler

    framework_task = compat.task(_framework_snoozer)
    name = framework_task.module_path
    reg = Registry()
    reg.register(name, TaskHandler(known_tasks.get(name)))
    _framework_snoozer.calls = 0
    result = framework_task.enqueue(7)

    run_in_process(reg, result.id)

    row = get(result.id)
    assert row.status == "succeeded" and row.attempt == 1 and row.error is None
    assert row.result == 14
    assert snoozes(result.id) == 1
    assert [r[0] for r in received] == ["task_snoozed", "task_succeeded"]


def _framework_snoozer(n):
    _framework_snoozer.calls += 1
    if _framework_snoozer.calls == 1:
        raise Snooze(0.2)
    return n * 2


# ---------------------------------------------------------------- cairnq_django.testing
def test_the_test_runner_snoozes_and_drains_the_task_when_due(store):
    def raises(ctx, payload):
        raise Snooze(60)

    reg = Registry()
    reg.register("sn.tested", lambda ctx, payload: ctx.snooze(60))
    reg.register("sn.raised", raises)
    with run_tasks(registry=reg, raise_exceptions=True) as tasks:
        snoozed = enqueue("sn.tested", {})
        raised = enqueue("sn.raised", {})
        ran = tasks.drain()
    assert sorted(r.status for r in ran) == ["queued", "queued"]
    assert [isinstance(r.exception, Snooze) for r in ran if r.task.id == raised.id] == [True]
    for task_id in (snoozed.id, raised.id):
        row = get(task_id)
        assert row.attempt == 0 and row.error is None and snoozes(task_id) == 1


# ---------------------------------------------------------------- admin
def test_the_admin_shows_the_snooze_count(admin_client, store):
    ctx = claimed(store, name="sn.admin")
    ctx.snooze(1)
    ctx = claim_again(store, ctx)
    ctx.snooze(1)
    plain = store.submit("sn.admin")

    page = admin_client.get(f"/admin/cairnq_django/task/{ctx.task_id}/change/")
    listing = admin_client.get("/admin/cairnq_django/task/")

    assert page.status_code == 200 and listing.status_code == 200
    html = page.content.decode()
    assert "Snoozes:" in html and '<div class="readonly">2</div>' in html
    listed = listing.content.decode()
    assert '0/3 <span class="cq-snoozes">2 snoozed</span>' in listed
    assert plain.id in listed and "0 snoozed" not in listed
    plain_page = admin_client.get(f"/admin/cairnq_django/task/{plain.id}/change/")
    assert '<div class="readonly">0</div>' in plain_page.content.decode()


# ---------------------------------------------------------------- worker processes
@pytest.mark.parametrize("how", ["ctx", "raise"])
def test_a_worker_process_snoozes_five_times_then_succeeds(live_store, child_env, runs_table, how):
    task = enqueue("tests.snooze", {"times": 5, "delay": 0.05, "how": how}, max_attempts=1)
    worker = WorkerProcess(child_env, "-v", "2", settings=NO_BACKOFF)
    try:
        wait_for(lambda: get(task.id).status == "succeeded", timeout=60,
                 message=f"not done: {get(task.id)}\n{worker.output()}")
    finally:
        worker.signal(15)
        worker.wait(60)
        out = worker.output()
        worker.stop()
    row = get(task.id)
    assert row.attempt == 1 and row.error is None
    assert row.result == {"attempt": 1, "runs": 6}
    assert [attempt for _, _, attempt, _ in runs("snooze")] == [1] * 6
    assert snoozes(task.id) == 5
    assert out.count(f"Task tests.snooze {task.id} attempt 1/1 snoozed for 50 ms after ") == 5
    assert " failed " not in out


def test_worker_processes_snooze_async_and_batched_handlers(live_store, child_env, runs_table):
    async_task = enqueue("tests.async_snooze", {"times": 2, "delay": 0.05, "how": "ctx"})
    async_raise = enqueue("tests.async_snooze", {"times": 1, "delay": 0.05, "how": "raise"})
    batch = [enqueue("tests.snooze_batch", {"snooze": i % 2 == 1, "delay": 0.05}) for i in range(4)]
    every = [async_task, async_raise, *batch]
    worker = WorkerProcess(child_env, settings=NO_BACKOFF)
    try:
        wait_for(lambda: all(get(t.id).status == "succeeded" for t in every), timeout=60,
                 message=f"not done: {[get(t.id) for t in every]}\n{worker.output()}")
    finally:
        worker.stop()
    assert all(get(t.id).attempt == 1 and get(t.id).error is None for t in every)
    assert [snoozes(t.id) for t in every] == [2, 1, None, 1, None, 1]
    assert get(async_task.id).result == {"attempt": 1, "async": True}


def test_a_worker_process_leaves_a_forever_snoozer_visible_and_cancelable(
    live_store, child_env, runs_table
):
    task = enqueue("tests.snooze", {"times": 10**6, "delay": 3600})
    worker = WorkerProcess(child_env)
    try:
        wait_for(lambda: snoozes(task.id) == 1, timeout=60, message=worker.output())
        row = get(task.id)
        assert row.status == "queued" and row.attempt == 0 and row.error is None
        assert row.run_at_ms - row.updated_at_ms == 3_600_000
        assert [t.id for t in list_tasks(status="queued", name="tests.snooze")] == [task.id]
        assert cancel(task.id).status == "canceled"
    finally:
        worker.stop()
    assert len(runs("snooze")) == 1


def test_a_worker_process_fails_a_bad_snooze_as_the_docs_say(live_store, child_env, runs_table):
    bad = enqueue("tests.snooze", {"times": 10, "delay": -1, "how": "raise"}, max_attempts=2)
    worker = WorkerProcess(child_env, settings=NO_BACKOFF)
    try:
        wait_for(lambda: get(bad.id).status == "failed", timeout=60, message=worker.output())
    finally:
        worker.stop()
    row = get(bad.id)
    # Retryable like any handler exception: both attempts ran and failed.
    assert row.attempt == 2 and row.error["type"] == "ValueError"
    assert "snooze delay" in row.error["message"]
    assert snoozes(bad.id) is None
