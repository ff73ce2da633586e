"""Business keys and the four conflict strategies (PROTOCOL-NOTES: Keys and conflicts)."""

from __future__ import annotations

import pytest

from cairnq_django import AlreadyExists

from .storeutil import age, run


def finish(store, task, outcome: str):
    """Drive a queued task to `outcome` (succeeded, failed or canceled)."""
    if outcome == "canceled":
        return store.cancel(task.id)
    [claimed] = store.claim(queues=[task.queue], worker_id="w", names=[task.name])
    assert claimed.id == task.id
    if outcome == "succeeded":
        return store.complete(task.id, "w", {"ok": True})
    return store.fail(task.id, "w", "no", retryable=False)


def test_a_key_points_at_its_task(store):
    task = store.submit("k", {"a": 1}, key="user-1")
    assert store.get_by_key("user-1").id == task.id
    assert store.get_status_by_key("user-1").status == "queued"
    assert store.get_by_key("nobody") is None and store.get_status_by_key("nobody") is None


@pytest.mark.parametrize("state", ["queued", "running"])
def test_reuse_returns_the_live_task(store, state):
    first = store.submit("k", {"v": 1}, key="order")
    if state == "running":
        store.claim(queues=["default"], worker_id="w")
    again = store.submit("k", {"v": 2}, key="order")
    assert again.id == first.id and again.payload == {"v": 1}
    assert len(store.list(name="k")) == 1


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "canceled"])
def test_reuse_starts_fresh_after_a_terminal_task(store, outcome):
    first = store.submit("k", key="order")
    finish(store, first, outcome)
    again = store.submit("k", key="order")
    assert again.id != first.id and again.status == "queued"
    assert store.get_by_key("order").id == again.id
    assert store.get(first.id).status == outcome  # the old row is left as it was


@pytest.mark.parametrize(
    "outcome, reused", [("succeeded", True), ("failed", False), ("canceled", False)]
)
def test_reuse_succeeded_also_keeps_a_success(store, outcome, reused):
    first = store.submit("k", key="report")
    finish(store, first, outcome)
    again = store.submit("k", key="report", conflict="reuse-succeeded")
    assert (again.id == first.id) is reused
    assert store.get_by_key("report").id == again.id


def test_reuse_succeeded_returns_a_live_task(store):
    first = store.submit("k", key="report")
    assert store.submit("k", key="report", conflict="reuse-succeeded").id == first.id


@pytest.mark.parametrize("outcome", [None, "running", "succeeded", "failed", "canceled"])
def test_reject_refuses_a_taken_key_in_any_state(store, outcome):
    first = store.submit("k", key="once")
    if outcome == "running":
        store.claim(queues=["default"], worker_id="w")
    elif outcome:
        finish(store, first, outcome)
    with pytest.raises(AlreadyExists) as info:
        store.submit("k", key="once", conflict="reject")
    assert info.value.key == "once" and "once" in str(info.value)
    assert store.get_by_key("once").id == first.id
    assert len(store.list(name="k")) == 1


def test_reject_accepts_a_free_key(store):
    assert store.submit("k", key="fresh", conflict="reject").status == "queued"


def test_replace_cancels_a_queued_task_and_repoints(store):
    first = store.submit("k", {"v": 1}, key="sync")
    second = store.submit("k", {"v": 2}, key="sync", conflict="replace")
    assert second.id != first.id
    old = store.get(first.id)
    assert old.status == "canceled" and old.completed_at_ms is not None
    assert store.get_by_key("sync").payload == {"v": 2}


def test_replace_requests_cancel_of_a_running_task(store):
    first = run(store, "k", key="sync")
    second = store.submit("k", key="sync", conflict="replace")
    old = store.get(first.id)
    assert old.status == "running" and old.cancel_requested_at_ms is not None
    assert store.get_by_key("sync").id == second.id
    # ... and when its worker finishes, cancel wins.
    assert store.complete(first.id, "w1", 1).status == "canceled"


def test_replace_leaves_a_terminal_task_untouched(store):
    first = store.submit("k", key="sync")
    done = finish(store, first, "succeeded")
    store.submit("k", key="sync", conflict="replace")
    after = store.get(first.id)
    assert after.status == "succeeded" and after.updated_at_ms == done.updated_at_ms


@pytest.mark.parametrize("conflict", ["reuse", "reuse-succeeded", "reject", "replace"])
def test_purging_the_task_frees_its_key(store, conflict):
    first = store.submit("k", key="freed")
    finish(store, first, "succeeded")
    age(store, first.id, 1_000)
    assert store.purge(older_than_ms=0) == [first.id]
    assert store.get_by_key("freed") is None
    again = store.submit("k", key="freed", conflict=conflict)
    assert again.id != first.id and store.get_by_key("freed").id == again.id


def test_by_key_control_operations(store):
    task = store.submit("k", key="ctl")
    assert store.cancel_by_key("ctl").status == "canceled"
    assert store.retry_by_key("ctl").status == "queued"
    assert store.get(task.id).status == "queued"
    assert store.cancel_by_key("missing") is None and store.retry_by_key("missing") is None


def test_retry_by_key_can_reset_the_attempt(store):
    task = run(store, "k", key="again", max_attempts=1)
    store.fail(task.id, "w1", "x", retryable=True)
    assert store.get(task.id).status == "failed"
    assert store.retry_by_key("again", reset_attempt=True).attempt == 0


@pytest.mark.parametrize("bad", ["", 5, None])
def test_invalid_conflict_or_key_is_refused_before_writing(store, bad):
    with pytest.raises(ValueError):
        store.submit("k", key="x", conflict="merge")
    if bad is not None:
        with pytest.raises(ValueError):
            store.submit("k", key=bad)
    assert store.list() == []
