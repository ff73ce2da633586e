"""Large enqueue_many batches: the rows read back are the rows asked for.

On Postgres a batch of COPY_MIN_ROWS or more streams through COPY, so these
tests cover that path there and the multi-row INSERT on SQLite.
"""

from __future__ import annotations

import pytest
from django.db import connections, transaction

import cairnq_django
from cairnq_django.errors import AlreadyExists
from cairnq_django.store import postgres_engine

from .storeutil import raw

# Text that COPY's text format must escape, and JSON that jsonb must keep.
AWKWARD = [
    {"tab": "a\tb", "newline": "x\ny\r\n", "backslash": "C:\\dir\\n", "quote": "\"'"},
    {"unicode": "ünïcödé ✓ 𝄞", "empty": "", "nested": {"list": [1, 2.5, None, True]}},
    ["top-level", "list"],
    "a bare string \\N",
    12345,
    None,
]


def big_batch(count):
    items = []
    for i in range(count):
        payload = AWKWARD[i % len(AWKWARD)]
        item = {"name": f"bulk{i % 3}", "payload": payload}
        if i % 7 == 0:
            item.update(queue="other", priority=i % 5, max_attempts=5, delay=60_000)
        if i % 11 == 0:
            item.update(metadata={"i": i, "tag": "x\ty"}, correlation_id=f"corr-{i}")
        items.append(item)
    return items


def test_a_batch_past_the_copy_threshold_reads_back_exactly(store):
    count = postgres_engine.COPY_MIN_ROWS * 2 + 3
    items = big_batch(count)
    tasks = cairnq_django.enqueue_many(items)
    assert len(tasks) == count
    for item, task in zip(items, tasks, strict=True):
        stored = store.get(task.id)
        assert stored == task  # the returned record is what the row holds
        assert stored.name == item["name"] and stored.status == "queued"
        expected = {} if item["payload"] is None else item["payload"]
        assert stored.payload == expected
        assert stored.queue == item.get("queue", "default")
        assert stored.priority == item.get("priority", 0)
        assert stored.max_attempts == item.get("max_attempts", 3)
        assert stored.metadata == item.get("metadata", {})
        assert stored.correlation_id == item.get("correlation_id")
        assert stored.root_id == stored.id and stored.parent_id is None
        assert stored.attempt == 0 and stored.lease_until_ms is None
        assert stored.run_at_ms == stored.created_at_ms + (60_000 if "delay" in item else 0)
    # One clock for the whole batch, as one INSERT would give it.
    assert len({t.created_at_ms for t in tasks}) == 1
    assert all(t.updated_at_ms == t.created_at_ms for t in tasks)


def test_a_large_batch_rolls_back_with_the_callers_transaction(live_store):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            cairnq_django.enqueue_many(big_batch(postgres_engine.COPY_MIN_ROWS + 1))
            raise RuntimeError("the view failed")
    assert raw(live_store, "SELECT count(*) FROM cairnq_tasks") == [(0,)]


def test_a_large_batch_with_a_rejected_key_writes_nothing(live_store):
    cairnq_django.enqueue("held", key="held-key")
    items = big_batch(postgres_engine.COPY_MIN_ROWS + 1)
    items.append({"name": "held", "key": "held-key", "conflict": "reject"})
    with pytest.raises(AlreadyExists):
        cairnq_django.enqueue_many(items)
    assert raw(live_store, "SELECT count(*) FROM cairnq_tasks") == [(1,)]


def test_a_large_batch_is_claimable_in_priority_order(store):
    tasks = cairnq_django.enqueue_many(
        [{"name": "p", "payload": {"i": i}, "priority": i % 4} for i in range(postgres_engine.COPY_MIN_ROWS)]
    )
    claimed = store.claim(queues=["default"], worker_id="w", limit=len(tasks))
    assert len(claimed) == len(tasks)
    assert [t.priority for t in claimed] == sorted((t.priority for t in tasks), reverse=True)


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="the notify trigger is Postgres-only"
)
def test_copied_rows_fire_the_queued_notification(live_store):
    import psycopg

    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    listener = psycopg.connect(**params, autocommit=True)
    try:
        listener.execute("LISTEN cairnq_queued")
        cairnq_django.enqueue_many(
            [{"name": "n", "queue": "copyq"} for _ in range(postgres_engine.COPY_MIN_ROWS)]
        )
        payloads = {n.payload for n in listener.notifies(timeout=5, stop_after=1)}
    finally:
        listener.close()
    assert payloads == {"copyq"}
