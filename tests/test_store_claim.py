"""Claim, leases, heartbeats and lease recovery (PROTOCOL-NOTES: State machine, Claim)."""

from __future__ import annotations

import pytest

from cairnq_django import LostLease

from .storeutil import expire_lease, raw, run, shift


def ids(tasks):
    return [t.id for t in tasks]


def test_claim_takes_highest_priority_then_earliest_due_then_id(store):
    low = store.submit("t", priority=0)
    high = store.submit("t", priority=9)
    mid_late = store.submit("t", priority=5)
    mid_early = store.submit("t", priority=5)
    # Make the second mid-priority task due earlier than the first.
    shift(store, mid_early.id, "run_at_ms", -5_000)
    order = ids(store.claim(queues=["default"], worker_id="w", limit=10))
    assert order == [high.id, mid_early.id, mid_late.id, low.id]


def test_equal_priority_and_due_time_breaks_ties_by_id(store):
    tasks = [store.submit("t") for _ in range(4)]
    for task in tasks:
        raw(store, "UPDATE cairnq_tasks SET run_at_ms = 1000 WHERE id = %s", [task.id])
    assert ids(store.claim(queues=["default"], worker_id="w", limit=4)) == sorted(ids(tasks))


def test_claim_sets_running_owner_lease_and_attempt(store):
    task = store.submit("t")
    [claimed] = store.claim(queues=["default"], worker_id="w9", lease_ms=60_000)
    assert claimed.status == "running" and claimed.worker_id == "w9"
    assert claimed.attempt == task.attempt + 1 == 1
    assert claimed.lease_until_ms >= claimed.updated_at_ms + 60_000 - 1_000


def test_claim_respects_limit_queue_and_delay(store):
    a = store.submit("t", queue="a")
    store.submit("t", queue="b")
    store.submit("t", queue="a", delay_ms=60_000)
    a2 = store.submit("t", queue="a")
    shift(store, a.id, "run_at_ms", -1_000)  # same millisecond would tie on the random id
    assert ids(store.claim(queues=["a"], worker_id="w", limit=1)) == [a.id]
    assert ids(store.claim(queues=["a"], worker_id="w", limit=5)) == [a2.id]
    assert store.claim(queues=["a"], worker_id="w", limit=5) == []  # only the delayed one is left


def test_claim_over_several_queues(store):
    a = store.submit("t", queue="a")
    b = store.submit("t", queue="b")
    store.submit("t", queue="c")
    assert set(ids(store.claim(queues=["a", "b"], worker_id="w", limit=5))) == {a.id, b.id}


def test_names_filter(store):
    x = store.submit("x")
    y = store.submit("y")
    store.submit("z")
    assert store.claim(queues=["default"], worker_id="w", names=[]) == []
    assert ids(store.claim(queues=["default"], worker_id="w", names=["y"])) == [y.id]
    assert ids(store.claim(queues=["default"], worker_id="w", names=["x", "nope"])) == [x.id]
    # names=None means no filter at all.
    assert len(store.claim(queues=["default"], worker_id="w", names=None, limit=5)) == 1


def test_limit_zero_claims_nothing(store):
    store.submit("t")
    assert store.claim(queues=["default"], worker_id="w", limit=0) == []


def test_claimed_task_is_not_claimed_twice(store):
    store.submit("t")
    assert len(store.claim(queues=["default"], worker_id="a")) == 1
    assert store.claim(queues=["default"], worker_id="b") == []


def test_claimable_probe(store):
    assert not store.probe_idle(queues=["default"]).work
    task = store.submit("t")
    assert store.probe_idle(queues=["default"]).work
    assert not store.probe_idle(queues=["default"], names=[]).work
    assert not store.probe_idle(queues=["default"], names=["other"]).work
    store.claim(queues=["default"], worker_id="w")
    assert not store.probe_idle(queues=["default"]).work
    expire_lease(store, task.id)
    assert store.probe_idle(queues=["default"]).work  # an expired lease is work too


@pytest.mark.parametrize("bad", [{"queues": []}, {"lease_ms": 0}, {"limit": -1}])
def test_claim_validates_arguments(store, bad):
    args = {"queues": ["default"], "worker_id": "w"} | bad
    with pytest.raises(ValueError):
        store.claim(**args)


# ------------------------------------------------------------------- recovery
def test_expired_lease_requeues_with_attempts_left(store):
    task = run(store, "t", max_attempts=3)
    store.progress(task.id, "w1", 0.4, "halfway")
    expire_lease(store, task.id)
    [again] = store.claim(queues=["default"], worker_id="w2")
    assert again.id == task.id and again.attempt == 2 and again.worker_id == "w2"
    # Recovery cleared what the dead attempt reported.
    assert again.progress is None and again.message is None


def test_recovery_requeues_without_claiming_in_the_same_call_when_not_due(store):
    task = run(store, "t")
    store.progress(task.id, "w1", 0.2, "x")
    expire_lease(store, task.id)
    # Claim for another queue: recovery still runs first, in the same transaction.
    assert store.claim(queues=["elsewhere"], worker_id="w2") == []
    row = store.get(task.id)
    assert row.status == "queued" and row.worker_id is None and row.lease_until_ms is None
    assert row.progress is None and row.message is None and row.completed_at_ms is None


def test_expired_lease_on_the_last_attempt_fails_the_task(store):
    task = run(store, "t", max_attempts=1)
    store.progress(task.id, "w1", 0.7, "late")
    expire_lease(store, task.id)
    store.claim(queues=["default"], worker_id="w2")
    row = store.get(task.id)
    assert row.status == "failed" and row.lease_until_ms is None
    assert row.worker_id == "w1" and row.completed_at_ms is not None
    assert row.error["code"] == "lease_expired" and row.error["retryable"] is False
    assert set(row.error) == {"type", "code", "message", "retryable", "details"}
    assert row.progress == 0.7 and row.message == "late"  # terminal rows keep them


def test_expired_lease_with_cancel_pending_ends_canceled(store):
    task = run(store, "t", max_attempts=5)
    store.cancel(task.id)
    expire_lease(store, task.id)
    store.claim(queues=["default"], worker_id="w2")
    row = store.get(task.id)
    assert row.status == "canceled" and row.lease_until_ms is None
    assert row.completed_at_ms is not None and row.error is None


def test_live_lease_is_not_recovered(store):
    task = run(store, "t")
    store.claim(queues=["default"], worker_id="w2")
    assert store.get(task.id).worker_id == "w1"


# ----------------------------------------------------------------- heartbeats
def test_heartbeat_extends_the_lease(store):
    task = run(store, "t")
    renewed = store.heartbeat(task.id, "w1", 120_000)
    assert renewed.lease_until_ms > task.lease_until_ms


@pytest.mark.parametrize("case", ["other-worker", "expired", "finished", "missing"])
def test_worker_writes_check_ownership(store, case):
    task = run(store, "t")
    worker = "w1"
    if case == "other-worker":
        worker = "intruder"
    elif case == "expired":
        expire_lease(store, task.id)
    elif case == "finished":
        store.complete(task.id, "w1", 1)
    task_id = "task_missing" if case == "missing" else task.id
    before = store.get(task.id)
    for write in (
        lambda: store.heartbeat(task_id, worker, 1000),
        lambda: store.progress(task_id, worker, 0.5, "m"),
        lambda: store.succeed(task_id, worker, 1),
        lambda: store.complete(task_id, worker, 1),
        lambda: store.fail(task_id, worker, "x"),
    ):
        with pytest.raises(LostLease) as info:
            write()
        assert info.value.task_id == task_id
    assert store.get(task.id) == before  # nothing was written


def test_heartbeat_batch_answers_only_for_held_tasks(store):
    held = run(store, "a")
    canceled = run(store, "b")
    store.cancel(canceled.id)
    expired = run(store, "c")
    other = run(store, "d", worker="w2")
    expire_lease(store, expired.id)  # after the last claim, which would recover it
    expired_lease = store.get(expired.id).lease_until_ms
    answer = store.heartbeat_batch(
        [held.id, canceled.id, expired.id, other.id, "task_nope"], "w1", 90_000
    )
    assert answer == {held.id: False, canceled.id: True}
    assert store.get(held.id).lease_until_ms > held.lease_until_ms
    assert store.get(expired.id).lease_until_ms == expired_lease  # not revived
    assert store.heartbeat_batch([], "w1", 1000) == {}


def test_heartbeat_batch_answers_in_the_order_asked(store):
    tasks = [run(store, f"o{i}") for i in range(4)]
    asked = [t.id for t in reversed(tasks)]
    assert list(store.heartbeat_batch(asked, "w1", 30_000)) == asked
