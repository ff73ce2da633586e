"""The reads the admin (and the queue overview) make, shaped for the protocol's indexes.

Each function takes the database alias and answers one question. The two that
run SQL text (store/sql.py) say why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import Count, Field, Min, OrderBy, Q
from django.db.models.expressions import RawSQL

from ..db.dialects import dialect_of
from ..db.expressions import RawText
from ..ids import now_ms
from ..models import Task
from ..records import TERMINAL_STATUSES
from . import get_store, sql

HOUR_MS = 3_600_000


def task_message(using: str, task_id: str) -> str | None:
    """The task's progress message as text; bytes that are not UTF-8 become U+FFFD."""
    value = (
        Task.objects.using(using)
        .filter(pk=task_id)
        .values_list(RawText("message"), flat=True)
        .first()
    )
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode(errors="replace")
    return value


def newest_first_ordering(using: str) -> list[OrderBy | str]:
    """The task list's newest-first order, along whichever index serves it.

    SQL on SQLite because the rowid is not a model field: SQLite's
    single-column indexes (name, root_id, correlation_id) end in the rowid, so a
    filtered page in rowid order reads a few index entries instead of sorting
    every match. Rows get rowids in insertion order, which is id order to the
    millisecond. Elsewhere the primary key (a ULID) is the order.
    """
    if dialect_of(using).has_rowid:
        # The model's own table name; the ORM has no name for SQLite's rowid.
        return [RawSQL(f"{Task._meta.db_table}.rowid", ()).desc(), "-id"]  # noqa: S611
    return ["-id"]


def distinct_task_values(using: str, column: str, limit: int) -> list[Any]:
    """Up to `limit` distinct values of an indexed task column, smallest first.

    SQL because Django has no recursive CTEs: each step asks the index for the
    next value greater than the last (a skip-scan), so a million rows with five
    queues cost five index probes instead of a DISTINCT over the table.
    """
    connection = connections[using]
    quote = connection.ops.quote_name
    table = quote(Task._meta.db_table)
    field = Task._meta.get_field(column)  # an unknown column raises FieldDoesNotExist
    if not isinstance(field, Field) or not field.column:
        raise ValueError(f"{column!r} is not a column of the tasks table.")
    with connection.cursor() as cursor:
        cursor.execute(sql.DISTINCT_VALUES.format(table=table, column=quote(field.column)), [limit])
        return [row[0] for row in cursor.fetchall()]


def estimated_task_count(using: str) -> int | None:
    """The planner's row count of the tasks table, or None where the database keeps none.

    SQL because the catalog estimate (pg_class.reltuples) is not a model.
    """
    if not dialect_of(using).has_row_estimate:
        return None
    with connections[using].cursor() as cursor:
        cursor.execute(sql.ROW_ESTIMATE, [Task._meta.db_table])
        row = cursor.fetchone()
    return max(0, int(row[0])) if row else None


def finished_since(using: str, queue: str, since_ms: int) -> dict[str, int]:
    """How many of the queue's tasks finished since `since_ms`, per terminal status.

    terminal() spells the status list as literals, so SQLite can prove the
    query implies the partial (queue, completed_at_ms) index's predicate.
    """
    # One row of filtered counts, not GROUP BY status: grouping would steer
    # SQLite to the (status, completed_at_ms) index across every queue.
    counts = (
        Task.objects.using(using).terminal()
        .filter(queue=queue, completed_at_ms__gte=since_ms)
        .aggregate(**{status: Count("id", filter=Q(status=status)) for status in TERMINAL_STATUSES})
    )
    return {status: int(n) for status, n in counts.items() if n}


@dataclass
class QueueStats:
    """One queue's counts: per status, the oldest due queued task, the last hour's finishes."""

    queue: str
    counts: dict[str, int]
    oldest_due_age_ms: int | None = None
    finished_last_hour: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(TERMINAL_STATUSES, 0)
    )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished_total(self) -> int:
        return sum(self.finished_last_hour.values())


def queue_stats(using: str, now: int | None = None) -> list[QueueStats]:
    """Counts per queue and status, the oldest due queued task, and the last hour's finishes."""
    now = now_ms() if now is None else now
    tasks = Task.objects.using(using)
    rows = {
        queue: QueueStats(queue=queue, counts=counts)
        for queue, counts in get_store(using).stats().items()
    }
    for queue, row in rows.items():
        # Probes per queue: (queue, status, ...) leads the claim index.
        oldest = tasks.filter(queue=queue).due(now).aggregate(
            oldest=Min("run_at_ms")
        )["oldest"]
        row.oldest_due_age_ms = None if oldest is None else max(0, now - oldest)
        row.finished_last_hour.update(finished_since(using, queue, now - HOUR_MS))
    return [rows[queue] for queue in sorted(rows)]
