"""Small helpers for store tests: move a row's clock columns instead of sleeping."""

from __future__ import annotations

from django.db import connections


def shift(store, task_id: str, column: str, by_ms: int) -> None:
    """Move one *_ms column of a task by `by_ms` (negative = into the past)."""
    with connections[store.using].cursor() as cursor:
        cursor.execute(
            f"UPDATE cairnq_tasks SET {column} = {column} + %s WHERE id = %s", [by_ms, task_id]
        )


def expire_lease(store, task_id: str) -> None:
    """Make a running task's lease lie in the past."""
    shift(store, task_id, "lease_until_ms", -10 * 60_000)


def age(store, task_id: str, ms: int) -> None:
    """Make a finished task look completed `ms` earlier than it was."""
    shift(store, task_id, "completed_at_ms", -ms)


def run(store, name: str = "t", worker: str = "w1", **submit):
    """Submit a task and claim it; return the claimed row."""
    task = store.submit(name, **submit)
    claimed = store.claim(queues=[task.queue], worker_id=worker, names=[name])
    assert [t.id for t in claimed] == [task.id]
    return claimed[0]


def raw(store, sql: str, params=None):
    with connections[store.using].cursor() as cursor:
        cursor.execute(sql, params or [])
        if cursor.description is None:
            return None
        return cursor.fetchall()
