"""The schedule table's operations: read, create, advance by compare-and-set, run now, pause.

Every write here runs in one transaction on the queue's database, and the
enqueue of an occurrence shares it: the task exists if and only if the
schedule's cursor moved past its occurrence. Two schedulers racing for the same
occurrence both try `UPDATE ... WHERE cursor_ms = <the cursor they read>`;
on PostgreSQL the second waits for the first's row lock and then matches no
row (READ COMMITTED re-checks the WHERE clause against the committed row); on
SQLite BEGIN IMMEDIATE serializes them outright. The loser writes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..declared import row_options
from ..models import ScheduleState
from ..records import TaskRecord
from ..store import get_store
from .config import Schedule


def read_states(using: str, names: list[str] | None = None) -> dict[str, ScheduleState]:
    """The state rows by name (all of them, or those of `names`)."""
    rows = ScheduleState.objects.using(using)
    if names is not None:
        rows = rows.filter(name__in=names)
    return {row.name: row for row in rows}


def ensure_states(using: str, names: list[str], now: int) -> dict[str, ScheduleState]:
    """Create a row, with the cursor at `now`, for each name that has none; return them all.

    A new (or renamed) schedule starts fresh: its first occurrence is the first
    one after it was first seen, not any before.
    """
    states = read_states(using, names)
    for name in names:
        if name not in states:  # another worker may create it first: get_or_create
            states[name], _ = ScheduleState.objects.using(using).get_or_create(
                name=name, defaults={"cursor_ms": now, "created_at_ms": now, "updated_at_ms": now}
            )
    return states


def _submit(using: str, schedule: Schedule, occurrence_ms: int | None, trigger: str) -> TaskRecord:
    store = get_store(using)
    metadata: dict[str, Any] = {
        **schedule.metadata, "schedule": schedule.name, "trigger": trigger,
    }
    if occurrence_ms is not None:
        metadata["occurrence_ms"] = occurrence_ms
    options = row_options(
        schedule.task, queue=schedule.queue, priority=schedule.priority,
        max_attempts=schedule.max_attempts,
    )
    spec = store.prepare(
        schedule.task, schedule.payload, queue=options.queue, priority=options.priority,
        max_attempts=options.max_attempts, metadata=metadata,
    )
    return store.submit_prepared(spec, key=schedule.key, conflict=schedule.conflict)


def advance(
    using: str,
    schedule: Schedule,
    *,
    expected_cursor_ms: int,
    occurrence_ms: int | None,
    new_cursor_ms: int,
) -> TaskRecord | bool | None:
    """Move the cursor from `expected_cursor_ms` to `new_cursor_ms`, enqueueing `occurrence_ms`.

    Returns the task enqueued for the occurrence (its metadata names it), True
    when the cursor moved without an enqueue
    (occurrence_ms None: missed occurrences passed over), or None when the
    compare-and-set lost: another scheduler moved the cursor first, or the
    schedule is paused. Nothing is written then.
    """
    with transaction.atomic(using=using):
        now = get_store(using).clock_ms()
        fields: dict[str, Any] = {"cursor_ms": new_cursor_ms, "updated_at_ms": now}
        if occurrence_ms is not None:
            fields.update(last_occurrence_ms=occurrence_ms, last_enqueued_at_ms=now)
        won = ScheduleState.objects.using(using).filter(
            name=schedule.name, cursor_ms=expected_cursor_ms, paused=False
        ).update(**fields)
        if not won:
            return None
        if occurrence_ms is None:
            return True
        task = _submit(using, schedule, occurrence_ms, "schedule")
        ScheduleState.objects.using(using).filter(name=schedule.name).update(
            last_task_id=task.id
        )
        return task


def run_now(using: str, schedule: Schedule) -> TaskRecord:
    """Enqueue the schedule's task now, outside its timetable; the cursor stays where it is."""
    with transaction.atomic(using=using):
        now = get_store(using).clock_ms()
        ensure_states(using, [schedule.name], now)
        rows = ScheduleState.objects.using(using).filter(name=schedule.name)
        # Row lock first, then the enqueue (and its key lock), in the order
        # advance() takes them, so the two never deadlock on a keyed schedule.
        rows.update(last_enqueued_at_ms=now, updated_at_ms=now)
        task = _submit(using, schedule, None, "manual")
        rows.update(last_task_id=task.id)
        return task


def set_paused(using: str, name: str, paused: bool) -> bool:
    """Pause or resume a schedule; return whether its state changed.

    A resumed schedule carries on from now: the occurrences that fell while it
    was paused are not run, however `missed` is set.
    """
    with transaction.atomic(using=using):
        now = get_store(using).clock_ms()
        ensure_states(using, [name], now)
        fields: dict[str, Any] = {"paused": paused, "updated_at_ms": now}
        if not paused:
            fields["cursor_ms"] = now
        return bool(
            ScheduleState.objects.using(using).filter(name=name, paused=not paused).update(
                **fields
            )
        )
