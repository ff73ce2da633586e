"""Per-attempt history (issue 32, item 4): what each settle records, get_task(), and its pruning."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.db import connections

import cairnq_django
from cairnq_django.models import TaskAttempt
from cairnq_django.records import Limit
from cairnq_django.retention.sweeper import RetentionSweeper
from cairnq_django.store.attempts import LOST_ERROR
from cairnq_django.testing import run_tasks
from tests.storeutil import age, expire_lease, run, shift


def outcomes(history):
    return [(a.attempt, a.outcome) for a in history.attempts]


def attempt_rows(task_id):
    return TaskAttempt.objects.filter(task_id=task_id).count()


def test_a_task_that_succeeds_at_once_writes_no_attempt_row(store):
    claimed = run(store, "plain")
    store.complete(claimed.id, "w1", {"ok": True})
    assert attempt_rows(claimed.id) == 0
    history = cairnq_django.get_task(claimed.id)
    assert outcomes(history) == [(1, "succeeded")]
    [final] = history.attempts
    assert final.worker_id == "w1" and final.ended_at_ms == history.task.completed_at_ms
    assert not final.recorded


def test_failures_then_success_keep_each_attempt_and_no_stale_error(db):
    task = cairnq_django.enqueue("tests.flaky", {"succeed_on": 3})
    with run_tasks(retries=True) as runner:
        runner.drain()
    history = cairnq_django.get_task(task.id)
    assert outcomes(history) == [(1, "retried"), (2, "retried"), (3, "succeeded")]
    first, second, final = history.attempts
    assert first.error["message"] == "flaky failure on attempt 1"
    assert second.error["message"] == "flaky failure on attempt 2"
    assert first.worker_id == runner.worker_id and first.recorded
    assert first.started_at_ms <= first.ended_at_ms <= second.started_at_ms
    assert final.error is None
    # The row keeps the protocol's last error; the history's current state does not.
    assert history.task.status == "succeeded" and history.error is None
    assert attempt_rows(task.id) == 2


def test_a_terminal_failure_is_its_own_row_and_the_current_error(store):
    claimed = run(store, "doomed", max_attempts=1)
    store.fail(claimed.id, "w1", "boom", retryable=True, started_at_ms=claimed.updated_at_ms)
    history = cairnq_django.get_task(claimed.id)
    assert outcomes(history) == [(1, "failed")]
    assert history.attempts[0].started_at_ms == claimed.updated_at_ms
    assert history.error["message"] == "boom" == history.attempts[0].error["message"]


def test_a_snooze_is_recorded_under_the_number_it_gave_back(store):
    claimed = run(store, "later")
    store.snooze(claimed.id, "w1", 1)
    shift(store, claimed.id, "run_at_ms", -60_000)
    again = store.claim(queues=["default"], worker_id="w2", names=["later"])[0]
    store.complete(again.id, "w2", None)
    history = cairnq_django.get_task(claimed.id)
    assert outcomes(history) == [(1, "snoozed"), (1, "succeeded")]
    assert [a.worker_id for a in history.attempts] == ["w1", "w2"]


def test_a_cancel_met_at_settle_is_recorded_as_canceled(store):
    claimed = run(store, "stop_me")
    store.cancel(claimed.id)
    store.fail(claimed.id, "w1", "interrupted")
    assert outcomes(cairnq_django.get_task(claimed.id)) == [(1, "canceled")]


def test_a_recovered_lease_is_a_lost_attempt_written_with_the_recovery(store):
    claimed = run(store, "crashy", worker="w1")
    expire_lease(store, claimed.id)
    [again] = store.claim(queues=["default"], worker_id="w2", names=["crashy"])
    store.complete(again.id, "w2", None)
    history = cairnq_django.get_task(claimed.id)
    assert outcomes(history) == [(1, "lost"), (2, "succeeded")]
    lost = history.attempts[0]
    assert lost.error == LOST_ERROR and lost.started_at_ms is None


@pytest.mark.django_db(transaction=True)
def test_a_lost_attempt_is_recorded_by_the_one_round_trip_claim(live_store):
    # Outside any transaction PostgreSQL recovers and claims in one query; the
    # recovery's rows, read from that query, are recorded right after it.
    claimed = run(live_store, "crashy_rt", worker="w1")
    expire_lease(live_store, claimed.id)
    [again] = live_store.claim(queues=["default"], worker_id="w2", names=["crashy_rt"])
    assert again.attempt == 2
    assert outcomes(cairnq_django.get_task(claimed.id)) == [(1, "lost"), (2, "running")]


def test_a_limited_claim_records_the_lost_attempts_it_recovers(store):
    claimed = run(store, "capped", worker="w1")
    expire_lease(store, claimed.id)
    limit = Limit(scope="name", value="capped", concurrency=5, rate=None, per_ms=None,
                  source="runtime")
    result = store.claim_limited(
        limits=[limit], queues=["default"], worker_id="w2", names=["capped"]
    )
    assert [task.id for task in result.tasks] == [claimed.id]
    assert outcomes(cairnq_django.get_task(claimed.id)) == [(1, "lost"), (2, "running")]


def test_a_lease_recovered_on_its_last_attempt_is_one_lost_attempt(store):
    claimed = run(store, "last", max_attempts=1)
    expire_lease(store, claimed.id)
    store.claim(queues=["default"], worker_id="w2", names=["other"])
    history = cairnq_django.get_task(claimed.id)
    assert history.task.status == "failed"
    assert outcomes(history) == [(1, "lost")]
    assert history.attempts[0].worker_id == "w1"  # recovery keeps a failed task's worker
    assert history.attempts[0].recorded


def test_attempts_no_row_describes_are_unrecorded(store):
    claimed = run(store, "peer_ran")
    # A peer in another language fails it retryably: no attempts row.
    with connections[store.using].cursor() as cursor:
        cursor.execute(
            "UPDATE cairnq_tasks SET status = 'queued', worker_id = NULL, lease_until_ms = NULL"
            " WHERE id = %s", [claimed.id],
        )
    again = store.claim(queues=["default"], worker_id="w2", names=["peer_ran"])[0]
    store.complete(again.id, "w2", None)
    history = cairnq_django.get_task(claimed.id)
    assert outcomes(history) == [(1, "unrecorded"), (2, "succeeded")]
    assert [a.recorded for a in history.attempts] == [False, False]


def test_get_task_of_an_unknown_id_is_none_and_the_async_twin_agrees(db):
    assert cairnq_django.get_task("no-such-task") is None
    task = cairnq_django.enqueue("queued_only", {})
    history = async_to_sync(cairnq_django.aget_task)(task.id)
    assert history.task.id == task.id and history.attempts == []


def test_every_purge_takes_the_attempts_with_the_task(store):
    ids = []
    for _ in range(3):
        claimed = run(store, "pruned", max_attempts=1)
        store.fail(claimed.id, "w1", "boom")
        age(store, claimed.id, 2 * 3_600_000)
        ids.append(claimed.id)
    assert TaskAttempt.objects.count() == 3
    assert store.purge_ids([ids[0]]) == [ids[0]]
    assert store.purge(older_than_ms=0, limit=1) == [ids[1]]
    RetentionSweeper(rules=3_600_000, pause_ms=0).sweep_once()
    assert not store.tasks().filter(id__in=ids).exists()
    assert TaskAttempt.objects.count() == 0


def test_a_peer_sdk_writes_no_attempt_rows(live_store):
    """Workers in other languages settle the task row only: their attempts have no rows."""
    from tests.peer import with_sdk

    task = cairnq_django.enqueue("peer.job", {}, max_attempts=3)

    async def work(client):
        [first] = await client.store.claim(queues=["default"], worker_id="sdk-1", names=["peer.job"])
        await client.store.fail(
            task_id=first.id, worker_id="sdk-1", retryable=True,
            error={"type": "Flaky", "code": "flaky", "message": "sdk try 1", "retryable": True,
                   "details": {}},
        )
        [second] = await client.store.claim(queues=["default"], worker_id="sdk-1", names=["peer.job"])
        await client.store.complete(task_id=second.id, worker_id="sdk-1", result="ok")

    with_sdk(work)
    history = cairnq_django.get_task(task.id)
    assert outcomes(history) == [(1, "unrecorded"), (2, "succeeded")]
    assert history.attempts[1].worker_id == "sdk-1"
    assert history.error is None and history.task.error["message"] == "sdk try 1"
    assert attempt_rows(task.id) == 0


@pytest.mark.django_db(transaction=True)
def test_lost_attempts_of_tasks_purged_meanwhile_are_skipped_not_raised(live_store):
    """After the one-round-trip claim commits, a purge may take a recovered task first."""
    from cairnq_django.store.attempts import record_lost_after

    kept = run(live_store, "kept", max_attempts=1)
    gone = run(live_store, "gone", max_attempts=1)
    expire_lease(live_store, kept.id)
    expire_lease(live_store, gone.id)
    recovered = live_store.recover_leases()  # records them: the rows are the point here
    TaskAttempt.objects.all().delete()
    live_store.purge_ids([gone.id])
    record_lost_after(live_store.using, recovered)
    assert list(TaskAttempt.objects.values_list("task_id", "outcome")) == [(kept.id, "lost")]
