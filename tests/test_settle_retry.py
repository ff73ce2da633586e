"""A completion that fails on the connection is retried while the task's lease could still be valid."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import OperationalError

from cairnq_django.worker import settler as settler_module
from cairnq_django.worker.settler import Settler, _Item

from .storeutil import run


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(settler_module, "RETRY_INITIAL_S", 0.01)
    monkeypatch.setattr(settler_module, "RETRY_MAX_S", 0.05)
    monkeypatch.setattr(settler_module, "LEASE_SLACK_S", 0.0)


class Outcome:
    """A settler item for `task_id`, and what its callback was given."""

    def __init__(self, task_id):
        self.item = _Item(task_id, "w1", "7", self.record)
        self.row = self.error = None

    def record(self, row, error):
        self.row, self.error = row, error

    def result(self):
        """The written row, or the item's error raised (the settler has given the outcome)."""
        assert self.item.done()
        if self.error is not None:
            raise self.error
        return self.row


def failing_for(store, monkeypatch, failures):
    """Make the first `failures` group writes fail as a dropped connection would; count calls."""
    real = store.complete_encoded_many
    calls = []

    def flaky(items):
        calls.append(len(items))
        if len(calls) <= failures:
            raise OperationalError("server closed the connection unexpectedly")
        return real(items)

    monkeypatch.setattr(store, "complete_encoded_many", flaky)
    return calls


def test_a_completion_outlasts_an_outage_shorter_than_its_lease(live_store, monkeypatch):
    (task,) = [run(live_store, name="t0", worker="w1")]
    calls = failing_for(live_store, monkeypatch, 6)
    settler = Settler(
        live_store, write_gate=threading.Lock(), lease_expired_by=lambda _id: time.monotonic() + 60,
    )
    outcome = Outcome(task.id)
    settler._write_group([outcome.item])
    assert outcome.result().status == "succeeded"
    assert len(calls) == 7  # six failures, then the write that went through


def test_a_completion_is_given_up_once_its_lease_has_certainly_expired(live_store, monkeypatch, caplog):
    (task,) = [run(live_store, name="t0", worker="w1")]
    calls = failing_for(live_store, monkeypatch, 1_000)
    expires = time.monotonic() + 0.3
    settler = Settler(live_store, write_gate=threading.Lock(), lease_expired_by=lambda _id: expires)
    outcome = Outcome(task.id)
    settler._write_group([outcome.item])
    with pytest.raises(OperationalError):
        outcome.result()
    assert time.monotonic() >= expires and len(calls) > 2
    assert "Lease recovery will run it again" in caplog.text
    assert live_store.get(task.id).status == "running"  # left to recovery


def test_renewals_during_the_outage_extend_the_retries(live_store, monkeypatch):
    (task,) = [run(live_store, name="t0", worker="w1")]
    calls = failing_for(live_store, monkeypatch, 1_000)
    renewed = {"at": time.monotonic()}
    settler = Settler(
        live_store, write_gate=threading.Lock(), lease_expired_by=lambda _id: renewed["at"] + 1.0,
    )
    item = Outcome(task.id).item
    writer = threading.Thread(target=settler._write_group, args=([item],))
    writer.start()
    for _ in range(5):  # a heartbeat renewing every 0.1 s keeps the completion trying
        time.sleep(0.1)
        renewed["at"] = time.monotonic()
        assert not item.done()
    writer.join(5)
    assert item.done() and len(calls) > 5


def test_without_a_known_lease_one_immediate_retry_as_before(live_store, monkeypatch):
    (task,) = [run(live_store, name="t0", worker="w1")]
    calls = failing_for(live_store, monkeypatch, 1_000)
    settler = Settler(live_store, write_gate=threading.Lock())
    outcome = Outcome(task.id)
    settler._write_group([outcome.item])
    with pytest.raises(OperationalError):
        outcome.result()
    assert len(calls) == 2


def test_a_stopping_worker_ends_the_retries(live_store, monkeypatch):
    (task,) = [run(live_store, name="t0", worker="w1")]
    failing_for(live_store, monkeypatch, 1_000_000)
    settler = Settler(
        live_store, write_gate=threading.Lock(), lease_expired_by=lambda _id: time.monotonic() + 60,
    )
    settler.start()
    outcome = []
    assert settler.complete_later(task.id, "w1", "7", lambda row, error: outcome.append(error))
    time.sleep(0.2)
    settler.stop(timeout=0.1)
    assert len(outcome) == 1 and isinstance(outcome[0], OperationalError)


def test_items_of_a_broken_group_are_written_alone_with_the_same_retries(live_store, monkeypatch):
    first, second = [run(live_store, name=f"t{i}", worker="w1") for i in range(2)]
    real = live_store.complete_encoded_many
    calls = []

    def refuse_groups_then_drop(items):
        calls.append(len(items))
        if len(items) > 1:
            raise RuntimeError("one row poisons the group")
        if len(calls) <= 4:  # the first item's first three writes alone fail on the connection
            raise OperationalError("server closed the connection unexpectedly")
        return real(items)

    monkeypatch.setattr(live_store, "complete_encoded_many", refuse_groups_then_drop)
    settler = Settler(
        live_store, write_gate=threading.Lock(), lease_expired_by=lambda _id: time.monotonic() + 60,
    )
    outcomes = [Outcome(first.id), Outcome(second.id)]
    settler._write_group([o.item for o in outcomes])
    assert [o.result().status for o in outcomes] == ["succeeded", "succeeded"]
    assert calls == [2, 1, 1, 1, 1, 1]
