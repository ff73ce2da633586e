"""Per-attempt history: written by the settles that end an attempt unsuccessfully, read by get_task().

An attempt that succeeds is the task row itself (its worker_id, attempt and
completed_at_ms), so plain successful tasks write nothing here. Every other
ending writes one models.TaskAttempt row in the transaction of the write
that ended it: a retryable or final fail, a snooze, a cancel met at settle,
and a lease that expired and was recovered ("lost"). History is then read as
those rows, plus the current attempt from the task row, plus an
"unrecorded" entry for each attempt number neither accounts for (one run by
a peer in another language, which writes no rows).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, transaction

from ..errors import error_envelope
from ..models import Task, TaskAttempt
from ..records import TaskRecord

logger = logging.getLogger("cairnq_django.worker")

# What a lost attempt's row says went wrong: the worker stopped renewing its lease.
LOST_ERROR = error_envelope(
    type="LeaseExpired",
    code="lease_expired",
    message="The worker's lease expired before the attempt ended; the task was recovered.",
    retryable=True,
)

# Where the settle left the task -> what became of the attempt.
_FAIL_OUTCOMES = {"queued": "retried", "failed": "failed", "canceled": "canceled"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Attempt:
    """One attempt of a task, as get_task() returns it.

    `outcome` is "running" or "succeeded" (the current attempt, read from the
    task row), "retried", "failed", "snoozed", "canceled", "lost", or
    "unrecorded" (no row: a peer in another language ran it, or its end was
    not written). Times are epoch ms; None where not known: a current
    attempt's start (kept only for attempts that end unsuccessfully), a lost
    attempt's start and, once recovery cleared it, its worker.
    """

    attempt: int
    outcome: str
    worker_id: str | None = None
    started_at_ms: int | None = None
    ended_at_ms: int | None = None
    error: Any = None
    #: Whether a row of the attempts table describes it (not the task row, not a gap).
    recorded: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskHistory:
    """A task and its attempts, oldest first."""

    task: TaskRecord
    attempts: list[Attempt]

    @property
    def error(self) -> Any:
        """The task's current error: None once it succeeded (an earlier attempt's stays in `attempts`)."""
        return None if self.task.status == "succeeded" else self.task.error


def record_ended(
    using: str, row: TaskRecord, worker_id: str, started_at_ms: int | None, *, snooze: bool = False
) -> None:
    """The attempt a fail() or snooze() just settled (call inside that settle's transaction).

    A requeued snooze gave its number back; a snooze writes no error.
    """
    snoozed = snooze and row.status == "queued"
    TaskAttempt.objects.using(using).create(
        task_id=row.id, attempt=row.attempt + 1 if snoozed else row.attempt,
        outcome="snoozed" if snoozed else _FAIL_OUTCOMES.get(row.status, row.status),
        worker_id=worker_id, started_at_ms=started_at_ms, ended_at_ms=row.updated_at_ms,
        error=None if snooze else row.error,
    )


def record_lost(using: str, recovered: Sequence[TaskRecord]) -> None:
    """The attempts whose expired leases a claim just recovered (one INSERT, only when any were)."""
    if not recovered:
        return
    TaskAttempt.objects.using(using).bulk_create([
        TaskAttempt(
            task_id=row.id, attempt=row.attempt, outcome="lost",
            # Recovery clears the worker of a task it requeues; it keeps a failed one's.
            worker_id=row.worker_id, ended_at_ms=row.updated_at_ms, error=LOST_ERROR,
        )
        for row in recovered
    ])


def record_lost_after(using: str, recovered: Sequence[TaskRecord]) -> None:
    """record_lost() once the recovery has committed (PostgreSQL's one-round-trip claim).

    The tasks may have been purged meanwhile, so only those still there are
    recorded, under a row lock that holds a purge off until this commits. A
    failure here loses history, never the claim that called it: it is logged.
    """
    if not recovered:
        return
    try:
        with transaction.atomic(using=using):
            present = set(
                Task.objects.using(using).filter(id__in=[row.id for row in recovered])
                .select_for_update().values_list("id", flat=True)
            )
            record_lost(using, [row for row in recovered if row.id in present])
    except DatabaseError:
        logger.warning(
            "Recording %d lost attempts failed; their history shows them as unrecorded.",
            len(recovered), exc_info=True,
        )


def history(using: str, task: TaskRecord) -> list[Attempt]:
    """Every attempt of `task`, oldest first (one query)."""
    rows = list(
        TaskAttempt.objects.using(using).filter(task_id=task.id).order_by("attempt", "id")
    )
    return attempts_of(task, rows)


def attempts_of(task: TaskRecord | Any, rows: Sequence[TaskAttempt]) -> list[Attempt]:
    """The history of `task` (a TaskRecord or a Task) from its attempt rows, ordered by attempt then id."""
    found = [
        Attempt(
            attempt=row.attempt, outcome=row.outcome, worker_id=row.worker_id,
            started_at_ms=row.started_at_ms, ended_at_ms=row.ended_at_ms, error=row.error,
            recorded=True,
        )
        for row in rows
    ]
    numbers = {row.attempt for row in rows}
    current = _current(task, numbers)
    if current is not None:
        found.append(current)
        numbers.add(current.attempt)
    # A gap: an attempt a peer in another language ran, or one no row describes.
    found += [
        Attempt(attempt=number, outcome="unrecorded")
        for number in range(1, task.attempt + 1) if number not in numbers
    ]
    # Stable: rows keep their id order within a number, the current attempt comes last.
    found.sort(key=lambda attempt: attempt.attempt)
    return found


def _current(task: TaskRecord | Any, numbers: set[int]) -> Attempt | None:
    """The attempt the task row itself describes, if no row does."""
    if task.attempt < 1:
        return None
    if task.status == "running":
        return Attempt(attempt=task.attempt, outcome="running", worker_id=task.worker_id)
    if task.status == "succeeded":
        return Attempt(
            attempt=task.attempt, outcome="succeeded", worker_id=task.worker_id,
            ended_at_ms=task.completed_at_ms,
        )
    if task.status in ("failed", "canceled") and task.attempt not in numbers:
        # Settled by a peer, or by a recovery no row was written for.
        return Attempt(
            attempt=task.attempt, outcome=task.status, worker_id=task.worker_id,
            ended_at_ms=task.completed_at_ms, error=task.error,
        )
    return None
