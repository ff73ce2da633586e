"""The Worker class run inside the test process: signals, the error hook, recovery."""

import asyncio
import threading

import pytest
from django.db import connection

from cairnq_django import TaskError, enqueue, get, signals
from cairnq_django.management.commands.cairnq_worker import WorkerBesideSweeper
from cairnq_django.worker import Registry, Worker
from tests.storeutil import sql
from tests.workerutil import wait_for


@pytest.fixture
def received():
    """Collect (signal, task name, status) for every worker signal sent."""
    seen = []
    receivers = {}
    for name in ("task_started", "task_succeeded", "task_failed", "task_retrying",
                 "task_canceled"):
        def receiver(sender, worker, task, _name=name, **kwargs):
            seen.append((_name, task.name, task.status))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver)
    yield seen
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def test_signals_follow_each_outcome(live_store, received):
    reg = Registry()
    reg.register("ip.ok", lambda ctx, payload: {"ok": True})

    def flaky(ctx, payload):
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")
        return "second try"

    def cancels_itself(ctx, payload):
        live_store.cancel(ctx.task_id)
        return "ignored"

    def refuses(ctx, payload):
        raise TaskError("nope", "Refused.")

    reg.register("ip.flaky", flaky)
    reg.register("ip.cancel", cancels_itself)
    reg.register("ip.refuse", refuses)
    for name in ("ip.ok", "ip.flaky", "ip.cancel", "ip.refuse"):
        enqueue(name, {})
    Worker(registry=reg, burst=True, retry_backoff_base_ms=0, concurrency=1).run()

    by_task = {}
    for signal_name, task_name, status in received:
        by_task.setdefault(task_name, []).append((signal_name, status))
    assert by_task["ip.ok"] == [("task_started", "running"), ("task_succeeded", "succeeded")]
    assert by_task["ip.flaky"] == [
        ("task_started", "running"), ("task_retrying", "queued"),
        ("task_started", "running"), ("task_succeeded", "succeeded"),
    ]
    assert by_task["ip.cancel"] == [("task_started", "running"), ("task_canceled", "canceled")]
    assert by_task["ip.refuse"] == [("task_started", "running"), ("task_failed", "failed")]


def test_a_failing_signal_receiver_does_not_affect_the_task(live_store):
    reg = Registry()
    reg.register("ip.ok", lambda ctx, payload: 1)

    def broken(sender, **kwargs):
        raise RuntimeError("metrics backend down")

    signals.task_succeeded.connect(broken)
    try:
        task = enqueue("ip.ok", {})
        Worker(registry=reg, burst=True).run()
    finally:
        signals.task_succeeded.disconnect(broken)
    assert get(task.id).status == "succeeded"


def test_async_handler_past_max_run_is_cancelled_and_fails_retryably(live_store):
    cancelled = threading.Event()

    async def hangs(ctx, payload):
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    reg = Registry()
    reg.register("ip.hangs", hangs)
    task = enqueue("ip.hangs", {}, max_attempts=1)
    Worker(registry=reg, burst=True, max_run_ms=300, shutdown_timeout_ms=0).run()
    row = get(task.id)
    assert row.status == "failed"
    assert row.error["code"] == "handler_timeout" and row.error["retryable"] is True
    assert cancelled.wait(5)


def test_stop_from_another_thread_ends_run(live_store):
    reg = Registry()
    reg.register("ip.ok", lambda ctx, payload: 1)
    worker = Worker(registry=reg, poll_ms=50)
    thread = threading.Thread(target=worker.run)
    thread.start()
    task = enqueue("ip.ok", {})
    wait_for(lambda: get(task.id).status == "succeeded", timeout=30)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()


def test_worker_survives_database_errors_and_reports_them(live_store):
    errors = []
    reg = Registry()
    reg.register("ip.ok", lambda ctx, payload: "after the outage")
    worker = Worker(
        registry=reg, poll_ms=50, on_error=lambda exc, context: errors.append((exc, context))
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: worker._heartbeat is not None, timeout=10)
        # A real failure of the claim query: a column it reads is briefly gone.
        # (A missing table is not an outage: the worker stops for it, see
        # test_missing_tables.py.)
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE cairnq_tasks RENAME COLUMN run_at_ms TO run_at_away")
        try:
            wait_for(lambda: errors, timeout=30, message="The claim error was not reported.")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE cairnq_tasks RENAME COLUMN run_at_away TO run_at_ms")
        task = enqueue("ip.ok", {})
        wait_for(lambda: get(task.id).status == "succeeded", timeout=60)
    finally:
        worker.stop()
        thread.join(30)
    exc, context = errors[0]
    assert context["phase"] == "claim" and context["worker_id"] == worker.worker_id


@pytest.mark.skipif(connection.vendor != "postgresql", reason="server-side disconnects")
def test_worker_reconnects_after_its_connections_are_killed(live_store):
    errors = []
    reg = Registry()
    reg.register("ip.ok", lambda ctx, payload: "reconnected")
    worker = Worker(registry=reg, poll_ms=50, on_error=lambda exc, ctx: errors.append(exc))
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        first = enqueue("ip.ok", {})
        wait_for(lambda: get(first.id).status == "succeeded", timeout=30)
        # What a database restart does to every connection the worker holds.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        wait_for(lambda: errors, timeout=30, message="The disconnect was not reported.")
        second = enqueue("ip.ok", {})
        wait_for(lambda: get(second.id).status == "succeeded", timeout=60)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_the_commands_sweep_runs_retention_beside_the_worker(live_store, settings):
    # cairnq_worker --sweep: the command, not the worker, starts the sweeper.
    settings.CAIRNQ = {"RETENTION": {"succeeded": 60_000}}
    old = live_store.submit("ip.old", {})
    [claimed] = live_store.claim(queues=["default"], worker_id="w-old", names=["ip.old"])
    live_store.complete(claimed.id, "w-old", None)
    sql(
        live_store.using,
        "UPDATE cairnq_tasks SET completed_at_ms = completed_at_ms - 3600000 WHERE id = %s",
        [old.id],
    )
    reg = Registry()
    reg.register("ip.ok", lambda ctx, payload: 1)
    worker = WorkerBesideSweeper(registry=reg, poll_ms=50)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: get(old.id) is None, timeout=30, message="The sweeper did not run.")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert worker.sweeper is not None and worker.sweeper.stopped


COLLECTED = []


def collect_error(exc, context):
    COLLECTED.append((type(exc).__name__, context))


def test_on_error_setting_is_a_dotted_path(live_store, settings):
    settings.CAIRNQ = {"ON_ERROR": "tests.test_worker_inprocess.collect_error"}
    reg = Registry()
    worker = Worker(registry=reg, burst=True)
    worker.report(RuntimeError("disk full"), phase="claim")
    assert COLLECTED == [("RuntimeError", {"phase": "claim", "worker_id": worker.worker_id})]


def test_a_completion_the_database_refuses_once_is_written_again(live_store, monkeypatch):
    """A returned call's completion goes to the settler without its handler
    thread waiting; the group meeting a database error twice (the settler's
    own reconnect included) still gets one more write, as the handler's own
    settle did, and the task succeeds once."""
    from django.db.utils import OperationalError

    errors, runs = [], []
    real = live_store.complete_encoded_many
    refusals = iter([True, True])

    def refuse_first_writes(items):
        if next(refusals, False):
            raise OperationalError("the server closed the connection")
        return real(items)

    monkeypatch.setattr(live_store, "complete_encoded_many", refuse_first_writes)
    reg = Registry()
    reg.register("ip.once", lambda ctx, payload: runs.append(ctx.attempt) or "done")
    task = enqueue("ip.once", {})
    worker = Worker(
        registry=reg, burst=True, concurrency=1,
        on_error=lambda exc, context: errors.append((exc, context)),
    )
    worker.store = live_store
    worker.settler.store = live_store
    worker.run()
    row = get(task.id)
    assert row.status == "succeeded" and row.result == "done" and row.attempt == 1
    assert runs == [1] and not errors


def test_a_completion_the_database_keeps_refusing_is_reported_and_left_to_recovery(
    live_store, monkeypatch
):
    from django.db.utils import OperationalError

    errors, ended = [], []

    def refuse(items):
        raise OperationalError("the server closed the connection")

    monkeypatch.setattr(live_store, "complete_encoded_many", refuse)
    reg = Registry()
    reg.register("ip.stuck", lambda ctx, payload: "done")
    task = enqueue("ip.stuck", {})
    # The settler retries for up to a lease (the heartbeat keeps renewing it
    # here, as the database only refuses the completion): a short one.
    worker = Worker(
        registry=reg, burst=True, concurrency=1, lease_ms=1_500,
        on_error=lambda exc, context: errors.append((exc, context)),
    )
    worker.store = live_store
    worker.settler.store = live_store

    def succeeded(sender, task, **kwargs):
        ended.append(task.id)

    signals.task_succeeded.connect(succeeded)
    try:
        worker.run()
    finally:
        signals.task_succeeded.disconnect(succeeded)
    assert get(task.id).status == "running"  # lease recovery settles it later
    assert not ended  # never reported as done
    assert [context["phase"] for _, context in errors] == ["settle"]
    assert len(worker._in_flight) == 0  # the call was released all the same
