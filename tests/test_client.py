"""The client API views call: enqueue, bulk enqueue, wait/call, backpressure, on_commit."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import Group
from django.db import connection, connections, transaction
from django.test import override_settings

import cairnq_django
from cairnq_django import (
    AlreadyExists,
    CairnQError,
    PendingTask,
    QueueFull,
    SerializationError,
    TaskCanceled,
    TaskFailed,
    TaskTimeout,
)
from cairnq_django.store.leases import get_leases


def count_tasks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_tasks")
        return cursor.fetchone()[0]


class FakeWorker:
    """A thread that claims one task name and settles each task with `settle`."""

    def __init__(self, name: str, settle, *, start_after: float = 0.0):
        self.name, self.settle, self.start_after = name, settle, start_after
        self.stop = threading.Event()
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        store = get_leases()
        try:
            if self.start_after:
                self.stop.wait(self.start_after)
            while not self.stop.is_set():
                for task in store.claim(queues=["default"], worker_id="fake", names=[self.name]):
                    self.seen.append(task.id)
                    self.settle(store, task)
                self.stop.wait(0.02)
        finally:
            connections.close_all()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def succeed_with(result):
    return lambda store, task: store.complete(task.id, "fake", result(task))


# ----------------------------------------------------------------- enqueue
def test_enqueue_returns_the_written_row(db):
    task = cairnq_django.enqueue(
        "send_email", {"to": "a@example.com"}, queue="mail", priority=3, max_attempts=5,
        metadata={"m": 1}, correlation_id="req-1",
    )
    assert cairnq_django.get(task.id) == task
    assert (task.status, task.queue, task.priority, task.max_attempts) == ("queued", "mail", 3, 5)
    assert task.metadata == {"m": 1} and task.correlation_id == "req-1"


def test_enqueue_in_a_committed_transaction_commits_with_the_callers_data(live_store):
    with transaction.atomic():
        Group.objects.create(name="committed")
        task = cairnq_django.enqueue("send_email", {"to": "a"})
    assert Group.objects.filter(name="committed").exists()
    assert live_store.get(task.id).status == "queued"


def test_enqueue_in_a_rolled_back_transaction_leaves_no_row(live_store):
    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        with transaction.atomic():
            Group.objects.create(name="rolled-back")
            task = cairnq_django.enqueue("send_email", {"to": "a"}, key="welcome-1")
            assert live_store.get(task.id) is not None  # visible inside the transaction
            raise Abort
    assert not Group.objects.filter(name="rolled-back").exists()
    assert live_store.get(task.id) is None and live_store.get_by_key("welcome-1") is None
    assert count_tasks() == 0


def test_delay_as_timedelta_or_milliseconds(db):
    a = cairnq_django.enqueue("later", delay=timedelta(minutes=2))
    b = cairnq_django.enqueue("later", delay=90_000)
    assert abs(a.run_at_ms - a.created_at_ms - 120_000) < 1_000
    assert abs(b.run_at_ms - b.created_at_ms - 90_000) < 1_000
    assert get_leases().claim(queues=["default"], worker_id="w") == []


def test_run_at_takes_an_aware_datetime(db):
    when = datetime.now(UTC) + timedelta(hours=1)
    task = cairnq_django.enqueue("later", run_at=when)
    assert abs(task.run_at_ms - int(when.timestamp() * 1000)) < 2_000
    past = cairnq_django.enqueue("later", run_at=when - timedelta(days=1))
    assert past.run_at_ms < past.created_at_ms + 1_000


@pytest.mark.parametrize(
    "options",
    [
        {"run_at": datetime(2030, 1, 1)},
        {"delay": -1},
        {"delay": "5s"},
        {"delay": 5, "run_at": datetime(2030, 1, 1, tzinfo=UTC)},
        {"conflict": "overwrite"},
        {"max_attempts": 0},
        {"priority": 1.5},
        {"queue": ""},
        {"metadata": ["not", "a", "dict"]},
        {"key": ""},
        {"key": 42},
    ],
)
def test_invalid_options_are_refused_before_writing(db, options):
    with pytest.raises(ValueError):
        cairnq_django.enqueue("x", **options)
    assert count_tasks() == 0


@pytest.mark.parametrize("payload", [float("nan"), float("inf"), b"raw", object()])
def test_non_json_payload_raises_and_writes_nothing(db, payload):
    with pytest.raises(SerializationError):
        cairnq_django.enqueue("x", {"v": payload})
    assert count_tasks() == 0


# ------------------------------------------------------------ enqueue_many
def test_enqueue_many_writes_all_in_input_order(db):
    tasks = cairnq_django.enqueue_many(
        [("a", {"i": 0}), {"name": "b", "payload": {"i": 1}, "queue": "q", "priority": 2},
         ("c",), {"name": "d", "key": "k-d", "delay": timedelta(seconds=30)}]
    )
    assert [t.name for t in tasks] == ["a", "b", "c", "d"]
    assert tasks[1].queue == "q" and tasks[1].priority == 2 and tasks[2].payload == {}
    assert cairnq_django.get_by_key("k-d").id == tasks[3].id
    assert tasks[3].run_at_ms - tasks[3].created_at_ms > 29_000
    assert count_tasks() == 4


def test_enqueue_many_reuses_keys_like_enqueue(db):
    first = cairnq_django.enqueue("a", key="k")
    tasks = cairnq_django.enqueue_many([{"name": "a", "key": "k"}, {"name": "a", "key": "k"}])
    assert [t.id for t in tasks] == [first.id, first.id]


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "x", "payload": {"n": float("nan")}},
        {"name": "x", "bogus": 1},
        {"payload": {}},
        {"name": "x", "conflict": "nope"},
        {"name": "x", "run_at": datetime(2030, 1, 1)},
        {"name": "x", "key": ""},
        ("x", {}, "a third element"),
        (),
        ("", {}),
        ("x", {"n": float("inf")}),
    ],
)
def test_enqueue_many_validates_everything_before_writing(db, bad):
    with pytest.raises((ValueError, SerializationError)):
        cairnq_django.enqueue_many([("ok", {}), ("ok", {}), bad])
    assert count_tasks() == 0


def test_an_unknown_conflict_gets_the_same_message_from_enqueue_and_enqueue_many(db):
    message = (
        "Unknown conflict strategy 'nope'; use one of reuse, reuse-succeeded, reject, replace."
    )
    with pytest.raises(ValueError) as one:
        cairnq_django.enqueue("x", conflict="nope")
    with pytest.raises(ValueError) as many:
        cairnq_django.enqueue_many([("ok", {}), {"name": "x", "conflict": "nope"}])
    assert str(one.value) == message
    assert str(many.value) == f"enqueue_many item 1: {message}"


def test_enqueue_many_is_one_transaction(live_store):
    cairnq_django.enqueue("a", key="taken")
    with pytest.raises(AlreadyExists):
        cairnq_django.enqueue_many(
            [("ok", {}), {"name": "a", "key": "fresh"}, {"name": "a", "key": "taken",
                                                        "conflict": "reject"}]
        )
    # The rows written before the rejection rolled back with it.
    assert count_tasks() == 1 and live_store.get_by_key("fresh") is None


def test_enqueue_many_of_nothing(db):
    assert cairnq_django.enqueue_many([]) == []


# -------------------------------------------------------------- wait / call
def test_call_returns_the_result(live_store):
    with FakeWorker("double", succeed_with(lambda t: {"n": t.payload["n"] * 2})):
        assert cairnq_django.call("double", {"n": 21}, timeout=30) == {"n": 42}


def test_wait_and_wait_by_key_return_the_final_row(live_store):
    task = cairnq_django.enqueue("echo", {"v": 1}, key="echo-1")
    with FakeWorker("echo", succeed_with(lambda t: t.payload)):
        done = cairnq_django.wait(task.id, timeout=timedelta(seconds=30))
        by_key = cairnq_django.wait_by_key("echo-1", timeout=30, poll_initial=10, poll_max=50)
    assert done.status == "succeeded" and done.result == {"v": 1}
    assert by_key.id == task.id


def test_wait_raises_task_failed_with_the_envelope(live_store):
    def fail(store, task):
        store.fail(task.id, "fake", {"type": "E", "code": "bounced", "message": "mailbox full",
                                     "retryable": False, "details": {}}, retryable=False)

    task = cairnq_django.enqueue("bounce")
    with FakeWorker("bounce", fail):
        with pytest.raises(TaskFailed) as info:
            cairnq_django.wait(task.id, timeout=30)
    assert info.value.task_id == task.id and info.value.code == "bounced"
    assert info.value.retryable is False and "mailbox full" in str(info.value)
    with FakeWorker("bounce2", fail):
        with pytest.raises(TaskFailed):
            cairnq_django.call("bounce2", timeout=30)
    assert cairnq_django.wait(task.id, raise_on_failure=False).status == "failed"


def test_wait_raises_task_canceled(live_store):
    task = cairnq_django.enqueue("never")
    cairnq_django.cancel(task.id)
    with pytest.raises(TaskCanceled) as info:
        cairnq_django.wait(task.id, timeout=5)
    assert info.value.task_id == task.id


def test_timeout_on_a_queued_task_names_the_likely_causes(live_store):
    task = cairnq_django.enqueue("nobody_handles_this", queue="orphans", key="orphan-1")
    with pytest.raises(TaskTimeout) as info:
        cairnq_django.wait_by_key("orphan-1", timeout=0.3, poll_initial=20)
    error = info.value
    assert error.task_id == task.id and error.key == "orphan-1"
    assert error.snapshot.status == "queued" and error.snapshot.id == task.id
    message = str(error)
    for cause in ("no worker", "nobody_handles_this", "orphans", "database"):
        assert cause in message
    assert isinstance(error, TimeoutError)
    assert live_store.get(task.id).status == "queued"  # the task is untouched


def test_timeout_on_a_running_task_leaves_it_running(live_store):
    task = cairnq_django.enqueue("slow", max_attempts=4)
    live_store.claim(queues=["default"], worker_id="busy-worker")
    with pytest.raises(TaskTimeout) as info:
        cairnq_django.wait(task.id, timeout=0.3, poll_initial=20)
    assert info.value.snapshot.status == "running" and info.value.key is None
    assert "still running" in str(info.value) and "1/4" in str(info.value)
    assert live_store.get(task.id).status == "running"
    assert live_store.complete(task.id, "busy-worker", 1).status == "succeeded"


def test_timeout_on_a_missing_task(live_store):
    with pytest.raises(TaskTimeout) as info:
        cairnq_django.wait("task_missing", timeout=0.1, poll_initial=20)
    assert info.value.task_id == "task_missing" and info.value.snapshot is None
    assert "no such task" in str(info.value)


def test_wait_and_call_refuse_to_run_inside_a_transaction(live_store):
    task = cairnq_django.enqueue("x")
    with transaction.atomic():
        for attempt in (
            lambda: cairnq_django.wait(task.id, timeout=1),
            lambda: cairnq_django.wait_by_key("k", timeout=1),
            lambda: cairnq_django.call("x", timeout=1),
        ):
            with pytest.raises(CairnQError, match="inside an open transaction"):
                attempt()
    assert count_tasks() == 1  # call wrote nothing


def test_the_async_faces_refuse_inside_a_transaction_too(live_store):
    task = cairnq_django.enqueue("x")
    with transaction.atomic():
        # Their database work runs on this thread (async_to_sync from sync code),
        # where the transaction is open.
        for face, first in (
            (cairnq_django.await_task, task.id),
            (cairnq_django.await_task_by_key, "k"),
            (cairnq_django.acall, "x"),
        ):
            with pytest.raises(CairnQError, match="inside an open transaction"):
                async_to_sync(face)(first, timeout=1)
    assert count_tasks() == 1  # acall wrote nothing


# ------------------------------------------------------------------- async
def test_async_twins(live_store):
    async def scenario():
        task = await cairnq_django.aenqueue("async_echo", {"v": "a"})
        done = await cairnq_django.await_task(task.id, timeout=30)
        result = await cairnq_django.acall("async_echo", {"v": "b"}, timeout=30)
        fetched = await cairnq_django.aget(task.id)
        # Outside a request nothing closes the executor thread's connection.
        await sync_to_async(connections.close_all)()
        return done, result, fetched

    with FakeWorker("async_echo", succeed_with(lambda t: t.payload)):
        done, result, fetched = asyncio.run(scenario())
    assert done.result == {"v": "a"} and result == {"v": "b"} and fetched == done


# ------------------------------------------------------------ backpressure
@override_settings(CAIRNQ={"MAX_QUEUE_DEPTH": {"bounded": 2}, "MAX_QUEUE_WAIT": 200})
def test_full_queue_raises_queue_full_and_writes_nothing(live_store):
    for _ in range(2):
        cairnq_django.enqueue("bp", queue="bounded")
    with pytest.raises(QueueFull) as info:
        cairnq_django.enqueue("bp", {"third": True}, queue="bounded")
    assert info.value.queue == "bounded" and info.value.max_depth == 2
    assert "bounded" in str(info.value)
    assert live_store.stats("bounded")["bounded"]["queued"] == 2
    # Other queues have no limit.
    for _ in range(3):
        cairnq_django.enqueue("bp", queue="free")
    with pytest.raises(QueueFull):
        cairnq_django.enqueue_many([{"name": "bp", "queue": "bounded"}])
    assert count_tasks() == 5


@override_settings(CAIRNQ={"MAX_QUEUE_DEPTH": 1, "MAX_QUEUE_WAIT": 30_000})
def test_enqueue_waits_for_headroom(live_store):
    first = cairnq_django.enqueue("bp")
    claimed = threading.Event()

    def drain():
        time.sleep(0.3)
        live = get_leases()
        live.claim(queues=["default"], worker_id="drainer")
        claimed.set()
        connections.close_all()

    thread = threading.Thread(target=drain)
    thread.start()
    second = cairnq_django.enqueue("bp")
    # It could only have been written once the drainer took the first task.
    assert claimed.is_set()
    thread.join()
    assert live_store.get(first.id).status == "running" and second.status == "queued"


@override_settings(CAIRNQ={"MAX_QUEUE_DEPTH": 1, "MAX_QUEUE_WAIT": 600_000})
def test_a_full_queue_inside_a_transaction_raises_at_once(live_store):
    """No ten-minute wait: waiting would hold the very transaction that blocks workers."""
    cairnq_django.enqueue("bp")
    with pytest.raises(QueueFull):
        with transaction.atomic():
            Group.objects.create(name="with-full-queue")
            cairnq_django.enqueue("bp")
    assert count_tasks() == 1 and not Group.objects.filter(name="with-full-queue").exists()


# --------------------------------------------------------------- on_commit
def test_on_commit_defers_the_write_until_commit(live_store):
    with transaction.atomic():
        pending = cairnq_django.enqueue("later", {"x": 1}, on_commit=True)
        assert isinstance(pending, PendingTask) and pending.name == "later"
        assert live_store.get(pending.id) is None
    task = live_store.get(pending.id)
    assert task is not None and task.payload == {"x": 1}
    assert pending.written and pending.task == task


def test_on_commit_with_a_reused_key_points_at_the_existing_task(live_store):
    existing = cairnq_django.enqueue("later", key="once")
    with transaction.atomic():
        pending = cairnq_django.enqueue("later", key="once", on_commit=True)
        assert not pending.written and pending.id != existing.id
    assert pending.id == existing.id and pending.task.id == existing.id
    assert count_tasks() == 1


def test_on_commit_never_writes_when_rolled_back(live_store):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            cairnq_django.enqueue("later", on_commit=True)
            raise RuntimeError("abort")
    assert count_tasks() == 0


@override_settings(CAIRNQ={"ENQUEUE_ON_COMMIT": True})
def test_on_commit_setting_and_outside_a_transaction(live_store):
    pending = cairnq_django.enqueue("later")
    assert isinstance(pending, PendingTask) and live_store.get(pending.id) is not None
    assert cairnq_django.enqueue("later", on_commit=False).status == "queued"


@pytest.mark.parametrize("older_than", [-1, timedelta(seconds=-1), None])
def test_purge_refuses_a_cutoff_that_is_not_zero_or_more_naming_its_argument(db, older_than):
    cairnq_django.enqueue("x")
    with pytest.raises(ValueError, match=r"^older_than must be an integer >= 0, got "):
        cairnq_django.purge(older_than=older_than)
    assert count_tasks() == 1


def test_list_is_importable_by_name_but_star_import_keeps_the_builtin():
    from cairnq_django import list as listed
    from cairnq_django.client import list_tasks

    assert listed is list_tasks
    assert "list" not in cairnq_django.__all__
    namespace: dict = {}
    exec("from cairnq_django import *", namespace)  # noqa: S102 - the statement under test
    assert "list" not in namespace and "list_tasks" in namespace
