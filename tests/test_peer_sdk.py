"""The reference peer `cairnq==0.15.1` and our store share one Django-migrated database.

The SDK runs in-process on its own asyncio connections against the committed
test database (the `live_store` fixture), so every check here crosses a real
connection boundary in both directions.
"""

from __future__ import annotations

import pytest
from django.db import connection

from . import catalog
from .peer import with_sdk

VENDOR = connection.vendor


def _snapshot():
    with connection.cursor() as cursor:
        return (
            catalog.catalog(cursor, VENDOR),
            catalog.ledger(cursor),
            catalog.meta_rows(cursor),
        )


def test_sdk_runs_no_migration_and_works_on_a_django_database(live_store):
    before = _snapshot()

    async def round_trip(client):
        submitted = await client.submit("peer.echo", {"n": 1})
        claimed = await client.store.claim(queues=["default"], worker_id="sdk-1")
        assert [t.id for t in claimed] == [submitted.id]
        done = await client.store.complete(
            task_id=submitted.id, worker_id="sdk-1", result={"echo": 1}
        )
        return submitted.id, done

    task_id, done = with_sdk(round_trip)
    assert done.status == "succeeded"
    # No ledger row added or touched, no object created, dropped or altered.
    assert _snapshot() == before
    ours = live_store.get(task_id)
    assert (ours.status, ours.result, ours.progress, ours.lease_until_ms) == (
        "succeeded", {"echo": 1}, 1.0, None,
    )
    assert ours.worker_id == "sdk-1" and ours.attempt == 1 and ours.root_id == task_id


def test_task_written_by_us_is_claimed_and_settled_by_the_sdk(live_store):
    task = live_store.submit(
        "peer.from_django", {"to": "a@example.com", "tags": ["x", None, 2.5]},
        priority=5, metadata={"origin": "django"}, correlation_id="corr-1",
    )

    async def work(client):
        seen = await client.get(task.id)
        claimed = await client.store.claim(
            queues=["default"], worker_id="sdk-2", names=["peer.from_django"]
        )
        await client.store.progress(
            task_id=task.id, worker_id="sdk-2", progress=0.5, message="half"
        )
        await client.store.complete(task_id=task.id, worker_id="sdk-2", result={"sent": True})
        return seen, claimed

    seen, claimed = with_sdk(work)
    assert seen.payload == {"to": "a@example.com", "tags": ["x", None, 2.5]}
    assert seen.metadata == {"origin": "django"} and seen.correlation_id == "corr-1"
    assert seen.root_id == task.id and seen.run_at_ms == task.run_at_ms
    assert [t.id for t in claimed] == [task.id]
    final = live_store.get(task.id)
    assert final.status == "succeeded" and final.result == {"sent": True}
    assert final.message == "half" and final.progress == 1.0


def test_task_written_by_the_sdk_is_claimed_and_settled_by_us(live_store):
    async def submit(client):
        return await client.submit("peer.from_sdk", {"n": 7}, key="order-7", max_attempts=2)

    submitted = with_sdk(submit)
    assert live_store.get_by_key("order-7").id == submitted.id
    # Same key, default strategy: the live task the SDK recorded is reused.
    assert live_store.submit("peer.from_sdk", {"n": 8}, key="order-7").id == submitted.id

    [claimed] = live_store.claim(queues=["default"], worker_id="dj-1", names=["peer.from_sdk"])
    assert claimed.id == submitted.id and claimed.payload == {"n": 7}
    live_store.progress(claimed.id, "dj-1", 0.3, "working")
    live_store.fail(claimed.id, "dj-1", "boom", retryable=True)

    async def second_attempt(client):
        requeued = await client.get(submitted.id)
        [again] = await client.store.claim(queues=["default"], worker_id="sdk-3")
        failed = await client.store.fail(
            task_id=again.id, worker_id="sdk-3",
            error={"type": "E", "code": "bad", "message": "no", "retryable": False, "details": {}},
            retryable=False,
        )
        return requeued, failed

    requeued, failed = with_sdk(second_attempt)
    assert requeued.status == "queued" and requeued.attempt == 1
    assert requeued.progress is None and requeued.message is None
    assert requeued.error["message"] == "boom" and requeued.error["retryable"] is True
    assert failed.status == "failed"
    ours = live_store.get(submitted.id)
    assert ours.status == "failed" and ours.error["code"] == "bad" and ours.attempt == 2


def test_cancel_from_the_sdk_wins_over_our_complete(live_store):
    task = live_store.submit("peer.cancel")
    [claimed] = live_store.claim(queues=["default"], worker_id="dj-2")

    async def cancel(client):
        return await client.cancel(task.id)

    requested = with_sdk(cancel)
    assert requested.status == "running" and requested.cancel_requested_at_ms is not None
    assert live_store.heartbeat_batch([task.id], "dj-2", 30_000) == {task.id: True}
    done = live_store.complete(claimed.id, "dj-2", {"ignored": True})
    assert done.status == "canceled" and done.result is None and done.lease_until_ms is None


def test_keyed_strategies_agree_across_implementations(live_store):
    first = live_store.submit("peer.key", key="report-1")

    async def work(client):
        from cairnq import AlreadyExists

        with pytest.raises(AlreadyExists):
            await client.submit("peer.key", key="report-1", conflict="reject")
        replaced = await client.submit("peer.key", {"v": 2}, key="report-1", conflict="replace")
        return replaced

    replaced = with_sdk(work)
    assert live_store.get(first.id).status == "canceled"
    assert live_store.get_by_key("report-1").id == replaced.id


def test_results_and_stats_read_the_same_from_both_sides(live_store):
    done = live_store.submit("peer.stats", queue="interop")
    live_store.submit("peer.stats", queue="interop")
    live_store.claim(queues=["interop"], worker_id="dj-3")
    live_store.complete(done.id, "dj-3", None)

    async def read(client):
        return await client.stats("interop"), await client.get(done.id)

    theirs, task = with_sdk(read)
    assert theirs == live_store.stats("interop")
    assert theirs["interop"]["succeeded"] == 1 and theirs["interop"]["queued"] == 1
    # A None result is stored as SQL NULL, as the peer writes it.
    assert task.result is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT result IS NULL FROM cairnq_tasks WHERE id = %s", [done.id])
        assert cursor.fetchone()[0] in (True, 1)
