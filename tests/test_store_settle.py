"""The state machine: settle, cancel, retry, progress (PROTOCOL-NOTES: State machine)."""

from __future__ import annotations

import pytest

from .storeutil import raw, run


def assert_lease_invariant(store):
    """lease_until_ms is set exactly on running rows, everywhere in the table."""
    rows = raw(store, "SELECT status, lease_until_ms FROM cairnq_tasks")
    for status, lease in rows:
        assert (lease is not None) == (status == "running"), (status, lease)


# ---------------------------------------------------------------- success
def test_complete_succeeds_with_result_and_full_progress(store):
    task = run(store)
    store.progress(task.id, "w1", 0.3, "working")
    done = store.complete(task.id, "w1", {"n": [1, 2]})
    assert done.status == "succeeded" and done.result == {"n": [1, 2]}
    assert done.progress == 1.0 and done.message == "working"
    assert done.lease_until_ms is None and done.worker_id == "w1"
    assert done.completed_at_ms is not None
    assert_lease_invariant(store)


def test_succeed_is_plain_success(store):
    task = run(store)
    done = store.succeed(task.id, "w1", "text result")
    assert done.status == "succeeded" and done.result == "text result"
    assert done.lease_until_ms is None and done.progress == 1.0


def test_complete_with_a_pending_cancel_ends_canceled(store):
    task = run(store)
    store.progress(task.id, "w1", 0.5, "half")
    requested = store.cancel(task.id)
    assert requested.status == "running" and requested.cancel_requested_at_ms is not None
    done = store.complete(task.id, "w1", {"late": True})
    assert done.status == "canceled" and done.result is None
    assert done.progress == 0.5 and done.message == "half"  # kept, not forced to 1.0
    assert done.lease_until_ms is None and done.completed_at_ms is not None


# ---------------------------------------------------------------- metadata
def test_metadata_is_rewritten_only_under_a_held_unexpired_lease(store):
    from cairnq_django import LostLease

    from .storeutil import expire_lease

    task = run(store, metadata={"m": 1})
    row = store.replace_metadata(task.id, "w1", {"m": 2, "log": [1]})
    assert row.metadata == {"m": 2, "log": [1]} and row.status == "running"
    assert row.updated_at_ms == task.updated_at_ms  # the claim's stamp, which the log reads
    with pytest.raises(LostLease):
        store.replace_metadata(task.id, "someone-else", {"m": 3})
    expire_lease(store, task.id)
    with pytest.raises(LostLease):
        store.replace_metadata(task.id, "w1", {"m": 4})
    other = run(store, name="t2")
    store.complete(other.id, "w1")
    with pytest.raises(LostLease):
        store.replace_metadata(other.id, "w1", {"m": 5})
    assert store.get(task.id).metadata == {"m": 2, "log": [1]}
    assert store.get(other.id).metadata == {}


def test_metadata_must_be_a_dict(store):
    task = run(store)
    with pytest.raises(ValueError, match="metadata must be a dict"):
        store.replace_metadata(task.id, "w1", ["not", "a", "dict"])


# ---------------------------------------------------------------- failure
def test_retryable_failure_requeues_and_clears_progress(store):
    task = run(store, max_attempts=3)
    store.progress(task.id, "w1", 0.6, "almost")
    requeued = store.fail(task.id, "w1", "flaky", retryable=True, delay_ms=60_000)
    assert requeued.status == "queued" and requeued.attempt == 1
    assert requeued.worker_id is None and requeued.lease_until_ms is None
    assert requeued.progress is None and requeued.message is None
    assert requeued.completed_at_ms is None
    assert requeued.run_at_ms >= requeued.updated_at_ms + 60_000 - 1_000
    assert requeued.error["message"] == "flaky" and requeued.error["retryable"] is True
    # Not due yet: a claim does not take it.
    assert store.claim(queues=["default"], worker_id="w2") == []
    assert_lease_invariant(store)


def test_retryable_failure_on_the_last_attempt_fails(store):
    task = run(store, max_attempts=1)
    store.progress(task.id, "w1", 0.9, None)
    failed = store.fail(task.id, "w1", "flaky", retryable=True)
    assert failed.status == "failed" and failed.worker_id == "w1"
    assert failed.lease_until_ms is None and failed.completed_at_ms is not None
    assert failed.progress == 0.9


def test_permanent_failure_fails_at_once(store):
    task = run(store, max_attempts=5)
    failed = store.fail(task.id, "w1", ValueError("bad input"), retryable=False)
    assert failed.status == "failed" and failed.attempt == 1
    assert failed.error == {
        "type": "ValueError", "code": "handler_error", "message": "bad input",
        "retryable": False, "details": {},
    }


def test_failure_stores_a_given_envelope_as_is(store):
    task = run(store)
    envelope = {"type": "T", "code": "c", "message": "m", "retryable": False, "details": {"a": 1}}
    assert store.fail(task.id, "w1", envelope, retryable=False).error == envelope


@pytest.mark.parametrize("retryable", [True, False])
def test_failure_with_a_pending_cancel_ends_canceled(store, retryable):
    task = run(store, max_attempts=5)
    store.cancel(task.id)
    done = store.fail(task.id, "w1", "x", retryable=retryable)
    assert done.status == "canceled" and done.lease_until_ms is None
    assert done.completed_at_ms is not None


def test_failure_rejects_a_negative_delay(store):
    task = run(store)
    with pytest.raises(ValueError):
        store.fail(task.id, "w1", "x", delay_ms=-1)
    assert store.get(task.id).status == "running"


# ----------------------------------------------------------------- cancel
def test_cancel_a_queued_task(store):
    task = store.submit("t")
    done = store.cancel(task.id)
    assert done.status == "canceled" and done.completed_at_ms is not None
    assert done.cancel_requested_at_ms is None
    assert store.claim(queues=["default"], worker_id="w") == []


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "canceled"])
def test_cancel_a_finished_task_is_a_no_op(store, outcome):
    task = run(store)
    if outcome == "succeeded":
        store.complete(task.id, "w1", 1)
    elif outcome == "failed":
        store.fail(task.id, "w1", "x", retryable=False)
    else:
        store.cancel(task.id)
        store.complete(task.id, "w1", 1)
    before = store.get(task.id)
    assert store.cancel(task.id) is None
    assert store.get(task.id) == before
    assert store.cancel("task_missing") is None


# ------------------------------------------------------------------ retry
@pytest.mark.parametrize("reset", [False, True])
def test_retry_a_failed_task(store, reset):
    task = run(store, max_attempts=1)
    store.progress(task.id, "w1", 0.5, "m")
    store.fail(task.id, "w1", "x", retryable=False)
    again = store.retry(task.id, reset_attempt=reset)
    assert again.status == "queued" and again.attempt == (0 if reset else 1)
    assert again.error is None and again.worker_id is None and again.completed_at_ms is None
    assert again.progress is None and again.message is None
    assert again.cancel_requested_at_ms is None and again.lease_until_ms is None
    [claimed] = store.claim(queues=["default"], worker_id="w2")
    assert claimed.attempt == (1 if reset else 2)


def test_retry_a_canceled_task_clears_the_cancel_request(store):
    task = run(store)
    store.cancel(task.id)
    store.complete(task.id, "w1", None)
    again = store.retry(task.id)
    assert again.status == "queued" and again.cancel_requested_at_ms is None
    [claimed] = store.claim(queues=["default"], worker_id="w2")
    assert store.complete(claimed.id, "w2", 1).status == "succeeded"


@pytest.mark.parametrize("state", ["queued", "running", "succeeded"])
def test_retry_only_applies_to_failed_or_canceled(store, state):
    task = store.submit("t")
    if state != "queued":
        store.claim(queues=["default"], worker_id="w")
    if state == "succeeded":
        store.complete(task.id, "w", 1)
    assert store.retry(task.id) is None
    assert store.get(task.id).status == state


# --------------------------------------------------------------- progress
def test_progress_coalesces_each_field(store):
    task = run(store)
    assert store.progress(task.id, "w1", 0.25, "start").progress == 0.25
    kept = store.progress(task.id, "w1", None, "later")
    assert (kept.progress, kept.message) == (0.25, "later")
    kept = store.progress(task.id, "w1", 0.75)
    assert (kept.progress, kept.message) == (0.75, "later")
    kept = store.progress(task.id, "w1")
    assert (kept.progress, kept.message) == (0.75, "later")


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", True])
def test_progress_must_be_a_fraction(store, bad):
    task = run(store)
    with pytest.raises(ValueError):
        store.progress(task.id, "w1", bad)


def test_lease_invariant_over_every_transition(store):
    """Drive every path out of running and check the whole table after each."""
    from .storeutil import expire_lease

    paths = [
        lambda t: store.complete(t.id, "w1", 1),
        lambda t: store.fail(t.id, "w1", "x", retryable=True),
        lambda t: store.fail(t.id, "w1", "x", retryable=False),
        lambda t: (store.cancel(t.id), store.complete(t.id, "w1", 1)),
        lambda t: (expire_lease(store, t.id), store.claim(queues=["none"], worker_id="w2")),
    ]
    for index, path in enumerate(paths):
        task = run(store, f"path{index}")
        assert_lease_invariant(store)
        path(task)
        assert_lease_invariant(store)


def test_an_error_that_is_not_json_is_reduced_to_its_text(store):
    task = run(store, max_attempts=1)
    envelope = {"type": "T", "code": "c", "message": "m", "retryable": False,
                "details": {"when": object()}}
    failed = store.fail(task.id, "w1", envelope, retryable=False)
    assert failed.status == "failed"
    assert failed.error == {"type": "T", "code": "c", "message": "m", "retryable": False,
                            "details": {}}
