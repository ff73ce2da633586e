"""Small helpers for store tests.

Rows are created through the store's public transitions (`run`, `make`),
moved in time by editing their clock columns instead of sleeping (`shift`,
`age`, `expire_lease`), and read or written behind the store's back with
plain SQL on a Django connection (`sql`, `raw`), never through the store's
private helpers.
"""

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


def make(store, status: str, name: str = "job", *, queue: str = "default", age_ms: int = 0,
         **submit):
    """Create one task in `status` through the store's own transitions; return its record.

    `status` is queued, running (claimed by worker w1), succeeded, failed
    (terminally) or canceled (while queued). A finished task is made to look
    completed `age_ms` earlier than it was (the record returned is then read
    again). Other keywords go to `store.submit`.
    """
    if status == "queued":
        task = store.submit(name, queue=queue, **submit)
    elif status == "canceled":
        task = store.cancel(store.submit(name, queue=queue, **submit).id)
    else:
        # Top priority, so the claim takes this task and not an older queued one.
        task = run(store, name, queue=queue, priority=1_000_000, **submit)
        if status == "succeeded":
            task = store.complete(task.id, "w1", {"ok": True})
        elif status == "failed":
            task = store.fail(task.id, "w1", "boom", retryable=False)
        elif status != "running":
            raise ValueError(status)
    if age_ms:
        age(store, task.id, age_ms)
        task = store.get(task.id)
    return task


def make_ids(store, status: str, name: str = "job", *, n: int = 1, **make_kwargs) -> list[str]:
    """`make` `n` tasks alike; return their ids in creation order."""
    return [make(store, status, name, **make_kwargs).id for _ in range(n)]


def sql(using: str, statement: str, params=None) -> list[dict]:
    """Run one statement on the `using` connection; its result rows as dicts ([] if none)."""
    with connections[using].cursor() as cursor:
        cursor.execute(statement, params or [])
        if cursor.description is None:
            return []
        columns = [column[0] for column in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


def raw(store, sql: str, params=None):
    with connections[store.using].cursor() as cursor:
        cursor.execute(sql, params or [])
        if cursor.description is None:
            return None
        return cursor.fetchall()
