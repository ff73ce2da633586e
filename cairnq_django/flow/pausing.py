"""Pause and resume a queue for the whole fleet.

The state is a row of QueueState. The claim itself (store/protocol_statements.py,
`_claimable`) leaves out every row whose queue is paused, so the probe, the
claim and the drained check all agree, and a claim statement that starts after
the pause commits can take nothing from that queue, whichever worker runs it.

What the flag cannot stop alone is a claim already in flight when it
commits: on PostgreSQL a claim statement reads the snapshot it started with.
So pausing then waits for the write transactions on cairnq_tasks that were
open at its commit (see _wait_for_open_writers); once pause_queue returns,
every claim that could have missed the pause has committed, and its tasks
show as running. On SQLite BEGIN IMMEDIATE already serializes the pause's
write with every claim.

Resuming wakes the workers the way an enqueue does: on PostgreSQL the
protocol's `cairnq_queued` notification with the queue as payload, sent at
commit; on SQLite the commit itself changes the data_version the wakeup
watches.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.db import connections, transaction

from ..models import QueueState
from ..records import QUEUED_CHANNEL
from ..store import get_store, sql
from ..validators import MAX_QUEUE_LENGTH, check_label

# Claims hold their transaction for milliseconds; anything open longer than
# this is some other writer (an enqueue inside a long atomic()), not a claim.
WRITERS_WAIT_S = 5.0
MAX_BY_LENGTH = 255


def _check(queue: Any, by: Any) -> None:
    check_label("queue", queue, MAX_QUEUE_LENGTH)
    check_by(by)


def check_by(by: Any) -> None:
    """The `by` of a fleet-wide change (pause, resume, a runtime limit): a string, "" for nobody."""
    if not isinstance(by, str):
        raise ValueError(f"by must be a string, got {by!r}.")
    if by:
        check_label("by", by, MAX_BY_LENGTH)


def notify_queued(using: str, queues: Iterable[str]) -> None:
    """PostgreSQL: the protocol's `cairnq_queued` for each queue, sent at commit, as an enqueue's is."""
    with connections[using].cursor() as cursor:
        for queue in queues:
            cursor.execute(sql.NOTIFY, [QUEUED_CHANNEL, queue])


def _set_paused(using: str, queue: str, paused: bool, by: str) -> bool:
    """Write the flag in one transaction; True if it changed."""
    store = get_store(using)
    rows = QueueState.objects.using(store.using)
    with transaction.atomic(using=store.using):
        now = store.clock_ms()
        changed = rows.filter(queue=queue).exclude(paused=paused).update(
            paused=paused, changed_at_ms=now, changed_by=by
        )
        if not changed and paused:
            # No row yet (or paused already). A caller creating the row
            # first paused it: not created, so not changed by us.
            _, changed = rows.get_or_create(
                queue=queue, defaults={"paused": True, "changed_at_ms": now, "changed_by": by}
            )
        if changed and not paused and store.dialect.has_listen_notify:
            notify_queued(store.using, [queue])
    return bool(changed)


def _wait_for_open_writers(using: str, timeout_s: float = WRITERS_WAIT_S) -> None:
    """PostgreSQL: wait until every transaction writing cairnq_tasks right now has ended.

    A claim takes its lock on cairnq_tasks with its first statement (the lease
    recovery) and takes its snapshot for the claim statement after that, so a
    claim that could not see the pause holds that lock now. pg_locks names the
    transactions; polling it blocks no one, where LOCK TABLE would queue every
    new enqueue and claim behind this wait.
    """
    connection = connections[using]
    # Only where writers run side by side (row locks) can a claim be in
    # flight across the pause's commit; inside a caller's transaction the
    # pause has not committed yet, so there is nothing to wait for.
    if not get_store(using).dialect.has_row_locks or connection.in_atomic_block:
        return
    held = sql.OPEN_TASK_WRITERS
    with connection.cursor() as cursor:
        cursor.execute(held)
        waiting = {row[0] for row in cursor.fetchall()}
        deadline = time.monotonic() + timeout_s
        pause_s = 0.002
        while waiting and time.monotonic() < deadline:
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 0.05)
            cursor.execute(held)
            waiting &= {row[0] for row in cursor.fetchall()}


def pause_queue(queue: str, *, using: str | None = None, by: str = "") -> bool:
    """Stop every Django worker claiming from `queue`; True if it was not paused already.

    Enqueue to the queue is still accepted and running tasks finish. When this
    returns, no task of the queue is claimed until resume_queue. Other CairnQ
    SDKs' workers do not read the pause (it is not in the protocol's tables).
    """
    _check(queue, by)
    alias = get_store(using).using
    changed = _set_paused(alias, queue, True, by)
    _wait_for_open_writers(alias)
    return changed


def resume_queue(queue: str, *, using: str | None = None, by: str = "") -> bool:
    """Let workers claim from `queue` again and wake them; True if it was paused."""
    _check(queue, by)
    return _set_paused(get_store(using).using, queue, False, by)


def paused_queues(*, using: str | None = None) -> list[str]:
    """The paused queues' names, sorted."""
    alias = get_store(using).using
    return list(
        QueueState.objects.using(alias).filter(paused=True).order_by("queue")
        .values_list("queue", flat=True)
    )


def queue_states(*, using: str | None = None) -> dict[str, QueueState]:
    """Every queue's state row (paused or resumed), by queue name."""
    alias = get_store(using).using
    return {row.queue: row for row in QueueState.objects.using(alias).order_by("queue")}
