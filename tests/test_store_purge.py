"""purge: terminal tasks only, filters, limit, oldest first (PROTOCOL-NOTES: purge)."""

from __future__ import annotations

import pytest

from .storeutil import age, run


def finished(store, outcome="succeeded", *, name="p", queue="default", ago_ms=60_000):
    task = run(store, name, queue=queue)
    if outcome == "succeeded":
        store.complete(task.id, "w1", None)
    elif outcome == "failed":
        store.fail(task.id, "w1", "x", retryable=False)
    else:
        store.cancel(task.id)
        store.complete(task.id, "w1", None)
    age(store, task.id, ago_ms)
    return task


def test_purge_deletes_only_finished_tasks_past_the_cutoff(store):
    old = finished(store, ago_ms=120_000)
    recent = finished(store, ago_ms=1_000)
    queued = store.submit("p")
    running = run(store, "other")
    assert store.purge(older_than_ms=60_000) == [old.id]
    assert store.get(old.id) is None
    for task in (recent, queued, running):
        assert store.get(task.id) is not None


def test_purge_takes_oldest_first_up_to_the_limit(store):
    tasks = [finished(store, ago_ms=10_000 * (i + 1)) for i in range(5)]
    oldest_first = [t.id for t in reversed(tasks)]
    assert store.purge(limit=2) == oldest_first[:2]
    assert store.purge(limit=2) == oldest_first[2:4]
    assert store.purge(limit=2) == oldest_first[4:]
    assert store.purge(limit=2) == []


def test_purge_filters_by_status_queue_and_name(store):
    s = finished(store, "succeeded", name="a", queue="q1")
    f = finished(store, "failed", name="a", queue="q2")
    c = finished(store, "canceled", name="b", queue="q1")
    assert store.purge(status="failed") == [f.id]
    assert store.purge(name="b") == [c.id]
    assert store.purge(queue="q2") == []
    assert store.purge(queue="q1", status="succeeded", name="a") == [s.id]


@pytest.mark.parametrize("status", ["queued", "running", "paused"])
def test_purge_refuses_a_non_terminal_status(store, status):
    finished(store)
    with pytest.raises(ValueError, match="finished"):
        store.purge(status=status)
    assert len(store.list()) == 1


@pytest.mark.parametrize("bad", [{"limit": 0}, {"older_than_ms": -1}])
def test_purge_validates_arguments(store, bad):
    with pytest.raises(ValueError):
        store.purge(**bad)


def test_purge_cascades_to_the_key(store):
    task = run(store, "p", key="k1")
    store.complete(task.id, "w1", None)
    age(store, task.id, 5_000)
    assert store.purge() == [task.id]
    assert store.get_by_key("k1") is None
