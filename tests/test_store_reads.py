"""Reads: get, list, stats and queue_depth (PROTOCOL-NOTES: Reads)."""

from __future__ import annotations

import pytest

from cairnq_django import TaskRecord, TaskStatus
from cairnq_django.records import COLUMNS, STATUSES

from .storeutil import raw, run


def test_get_returns_every_column_decoded(store):
    task = store.submit(
        "r", {"x": [1, {"y": None}]}, queue="q", max_attempts=4, priority=2,
        metadata={"m": "v"}, correlation_id="c-1",
    )
    row = store.get(task.id)
    assert isinstance(row, TaskRecord) and row == task
    assert set(row.as_dict()) == set(COLUMNS)
    assert row.id.startswith("task_") and len(row.id) == 5 + 26
    assert (row.payload, row.metadata, row.queue, row.max_attempts, row.priority) == (
        {"x": [1, {"y": None}]}, {"m": "v"}, "q", 4, 2,
    )
    assert row.root_id == row.id and row.parent_id is None and row.correlation_id == "c-1"
    assert row.attempt == 0 and row.result is None and row.error is None
    assert row.created_at_ms == row.updated_at_ms and row.run_at_ms >= row.created_at_ms
    assert store.get("task_missing") is None


def test_defaults(store):
    task = store.submit("r")
    assert (task.payload, task.metadata, task.queue, task.max_attempts, task.priority) == (
        {}, {}, "default", 3, 0,
    )


def test_children_carry_parent_and_root(store):
    parent = store.submit("parent")
    child = store.submit("child", parent_id=parent.id, root_id=parent.root_id)
    grandchild = store.submit("child", parent_id=child.id, root_id=child.root_id)
    assert grandchild.root_id == parent.id and grandchild.parent_id == child.id
    assert {t.id for t in store.list(root_id=parent.id)} == {parent.id, child.id, grandchild.id}


def test_get_status_is_id_and_status_only(store):
    task = store.submit("r")
    assert store.get_status(task.id) == TaskStatus(id=task.id, status="queued")
    assert store.get_status("task_missing") is None


def test_list_filters_and_orders_newest_first(store):
    a = store.submit("alpha", queue="q1", correlation_id="c")
    b = store.submit("beta", queue="q2")
    c = store.submit("alpha", queue="q2")
    raw(store, "UPDATE cairnq_tasks SET created_at_ms = 100 WHERE id = %s", [a.id])
    raw(store, "UPDATE cairnq_tasks SET created_at_ms = 200 WHERE id = %s", [b.id])
    raw(store, "UPDATE cairnq_tasks SET created_at_ms = 300 WHERE id = %s", [c.id])
    store.cancel(b.id)
    assert [t.id for t in store.list()] == [c.id, b.id, a.id]
    assert [t.id for t in store.list(name="alpha")] == [c.id, a.id]
    assert [t.id for t in store.list(queue="q2", status="queued")] == [c.id]
    assert [t.id for t in store.list(status="canceled")] == [b.id]
    assert [t.id for t in store.list(correlation_id="c")] == [a.id]
    assert [t.id for t in store.list(limit=1, offset=1)] == [b.id]
    assert store.list(limit=0) == []


def test_list_breaks_created_ties_by_id_descending(store):
    tasks = [store.submit("r") for _ in range(3)]
    raw(store, "UPDATE cairnq_tasks SET created_at_ms = 5")
    assert [t.id for t in store.list()] == sorted((t.id for t in tasks), reverse=True)


@pytest.mark.parametrize("bad", [{"status": "paused"}, {"limit": -1}, {"offset": -1}])
def test_list_validates(store, bad):
    with pytest.raises(ValueError):
        store.list(**bad)


def test_stats_zero_fills_every_status(store):
    store.submit("s", queue="a")
    running = run(store, "s", queue="b")
    store.complete(running.id, "w1", None)
    store.submit("s", queue="b")
    stats = store.stats()
    assert stats == {
        "a": dict.fromkeys(STATUSES, 0) | {"queued": 1},
        "b": dict.fromkeys(STATUSES, 0) | {"queued": 1, "succeeded": 1},
    }
    assert list(stats["a"]) == list(STATUSES)


def test_stats_for_one_queue_always_names_it(store):
    store.submit("s", queue="a")
    assert store.stats("a") == {"a": dict.fromkeys(STATUSES, 0) | {"queued": 1}}
    assert store.stats("empty") == {"empty": dict.fromkeys(STATUSES, 0)}
    assert store.stats() == {"a": dict.fromkeys(STATUSES, 0) | {"queued": 1}}


def test_queue_depth_counts_queued_including_delayed(store):
    assert store.queue_depth("d", 3) == 3
    store.submit("q", queue="d")
    store.submit("q", queue="d", delay_ms=3_600_000)
    store.submit("q", queue="other")
    assert store.queue_depth("d", 3) == 1
    run(store, "q-run", queue="d")  # running tasks do not count
    assert store.queue_depth("d", 3) == 1
    for _ in range(5):
        store.submit("q", queue="d")
    assert store.queue_depth("d", 3) == 0  # never negative
    with pytest.raises(ValueError):
        store.queue_depth("d", 0)


def test_task_ids_are_prefixed_ulids_with_a_millisecond_clock(store):
    import re
    import time

    crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    before = int(time.time() * 1000)
    task = store.submit("r")
    after = int(time.time() * 1000)
    assert re.fullmatch(r"task_[0-9A-HJKMNP-TV-Z]{26}", task.id)
    stamp = 0
    for char in task.id[5:15]:  # 10 characters = the 48-bit millisecond time
        stamp = stamp * 32 + crockford.index(char)
    assert before <= stamp <= after
    assert len({store.submit("r").id for _ in range(50)}) == 50
