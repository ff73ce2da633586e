"""Grouped completion (LeaseOperations.complete_encoded_many) and the worker's Settler."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from cairnq_django.errors import LostLease, SerializationError
from cairnq_django.store.encoding import encode_result
from cairnq_django.worker.settler import Settler

from .storeutil import expire_lease, raw, run
from .workerutil import wait_for


def claimed(store, count, worker="w1"):
    return [run(store, name=f"t{i}", worker=worker) for i in range(count)]


def test_a_group_completes_every_row_it_still_owns_and_reports_the_others(store):
    held, expired, foreign, cancel = claimed(store, 4)
    expire_lease(store, expired.id)
    store.cancel(cancel.id)
    rows = store.complete_encoded_many(
        [
            (held.id, "w1", encode_result({"ok": 1})),
            (expired.id, "w1", encode_result(None)),
            (foreign.id, "someone-else", encode_result(None)),
            (cancel.id, "w1", encode_result("late")),
        ]
    )
    assert rows[1] is None and rows[2] is None  # lease gone / not ours: nothing written
    assert rows[0].status == "succeeded" and rows[0].result == {"ok": 1}
    assert rows[0].progress == 1.0 and rows[0].lease_until_ms is None
    assert rows[3].status == "canceled" and rows[3].result is None
    assert store.get(expired.id).status == "running"
    assert store.get(foreign.id).status == "running" and store.get(foreign.id).worker_id == "w1"
    # The answer is in the order asked, whatever order the database returned rows in.
    assert [r.id for r in rows if r] == [held.id, cancel.id]


def test_a_group_stores_none_as_sql_null_like_complete(store):
    (task,) = claimed(store, 1)
    (row,) = store.complete_encoded_many([(task.id, "w1", encode_result(None))])
    assert row.result is None
    assert raw(store, "SELECT result IS NULL FROM cairnq_tasks WHERE id = %s", [task.id]) == [
        (True,)
    ]


def test_an_unencodable_result_is_refused_before_anything_is_queued(store):
    with pytest.raises(SerializationError):
        encode_result({"when": object()})


def test_an_empty_group_writes_nothing(store):
    assert store.complete_encoded_many([]) == []


# ---------------------------------------------------------------- the settler thread
@pytest.fixture
def settler(live_store):
    gate = threading.Lock()
    settler = Settler(live_store, write_gate=gate)
    settler.start()
    yield settler
    settler.stop()


class HeldGate:
    """A write gate the test holds shut, which says when the settler is waiting at it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reached = threading.Event()

    def __enter__(self):
        self.reached.set()
        self.lock.acquire()

    def __exit__(self, *exc_info):
        self.lock.release()


def test_settler_completes_from_many_threads_each_learning_its_own_outcome(live_store):
    gate = HeldGate()
    settler = Settler(live_store, write_gate=gate)
    settler.start()
    first, *rest = tasks = claimed(live_store, 12)
    expire_lease(live_store, tasks[5].id)
    outcomes = {}

    def finish(task):
        try:
            outcomes[task.id] = settler.complete(task.id, "w1", {"id": task.id})
        except LostLease as exc:
            outcomes[task.id] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=finish, args=(t,)) for t in tasks]
    with gate.lock:
        # The first completion alone reaches the shut gate; the other eleven
        # queue behind it meanwhile and must go out together as one group.
        threads[0].start()
        assert gate.reached.wait(30)
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: settler.waiting() == len(rest), timeout=30)
    for thread in threads:
        thread.join(30)
    settler.stop()
    assert isinstance(outcomes[tasks[5].id], LostLease)
    for task in tasks[:5] + tasks[6:]:
        row = outcomes[task.id]
        assert row.status == "succeeded" and row.result == {"id": task.id}
    assert settler.settled == 11
    assert settler.groups == 2
    assert first.id in outcomes


def test_settler_after_stop_writes_alone_instead_of_queueing(live_store, settler):
    (task,) = claimed(live_store, 1)
    settler.stop()
    row = settler.complete(task.id, "w1", 7)
    assert row.status == "succeeded" and row.result == 7


def test_a_broken_group_is_retried_one_by_one(live_store, settler, monkeypatch):
    first, second = claimed(live_store, 2)
    real = live_store.complete_encoded_many

    def refuse_groups(items):
        if len(items) > 1:
            raise RuntimeError("one row poisons the group")
        return real(items)

    monkeypatch.setattr(live_store, "complete_encoded_many", refuse_groups)
    outcomes = {}
    group = [
        settler_item(first.id, outcomes),
        settler_item(second.id, outcomes),
    ]
    settler._write_group(group)
    assert [result(outcomes[item.task_id]).status for item in group] == ["succeeded", "succeeded"]


def settler_item(task_id, outcomes):
    """A settler item whose callback records (row, error) in `outcomes` under its task id."""
    from cairnq_django.worker.settler import _Item

    def then(row, error):
        outcomes[task_id] = (row, error)

    return _Item(task_id, "w1", None, then)


def result(outcome):
    """The row of a (row, error) outcome, or its error raised."""
    row, error = outcome
    if error is not None:
        raise error
    return row


def test_complete_later_hands_each_outcome_to_its_callback_after_the_commit(live_store):
    gate = HeldGate()
    settler = Settler(live_store, write_gate=gate)
    settler.start()
    held, expired = claimed(live_store, 2)
    expire_lease(live_store, expired.id)
    outcomes = {}
    done = threading.Event()

    def then(task_id):
        def record(row, error):
            # Called once the group is written, on the settler thread itself.
            outcomes[task_id] = (row, error, threading.current_thread().name)
            if len(outcomes) == 2:
                done.set()

        return record

    with gate.lock:
        assert settler.complete_later(held.id, "w1", encode_result({"ok": 1}), then(held.id))
        assert gate.reached.wait(30)
        assert not outcomes  # nothing is reported before the write
        assert settler.complete_later(expired.id, "w1", encode_result(None), then(expired.id))
    assert done.wait(30)
    settler.stop()
    row, error, thread = outcomes[held.id]
    assert error is None and row.status == "succeeded" and row.result == {"ok": 1}
    assert thread == "cairnq-settler"
    row, error, _ = outcomes[expired.id]
    assert row is None and isinstance(error, LostLease)
    # Stopped: nothing more is queued, and the caller is told so.
    assert not settler.complete_later(held.id, "w1", None, then("late"))
