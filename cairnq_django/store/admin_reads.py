"""The reads the admin (and the queue overview) make that the ORM cannot spell.

Each function takes the database alias and answers one question. The SQL ones
say why they are SQL; the rest are QuerySets shaped for the same indexes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.db.models import BinaryField, Field, Min, OrderBy, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from ..ids import now_ms
from ..models import Task
from ..records import TERMINAL_STATUSES
from . import get_store
from .dialects import dialect_of

HOUR_MS = 3_600_000


def raw_column(column: str, using: str) -> Cast:
    """A task column as text the driver can always fetch: bytes where bad text fails the fetch.

    Python's sqlite3 decodes TEXT while fetching, and one value that is not
    UTF-8 fails the whole query; a BLOB comes back as bytes. PostgreSQL text is
    always valid, and jsonb::text prints any jsonb, however deep.
    """
    raw = dialect_of(using).reads_raw(column)
    return Cast(column, BinaryField() if raw else TextField())


def task_message(using: str, task_id: str) -> str | None:
    """The task's progress message as text; bytes that are not UTF-8 become U+FFFD."""
    value = (
        Task.objects.using(using)
        .filter(pk=task_id)
        .values_list(raw_column("message", using), flat=True)
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
        return [RawSQL(f"{Task._meta.db_table}.rowid", ()).desc(), "-id"]
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
    name = quote(field.column)
    sql = (
        f"WITH RECURSIVE v(value, n) AS ("
        f" SELECT (SELECT {name} FROM {table} ORDER BY {name} LIMIT 1), 1"
        f" UNION ALL"
        f" SELECT (SELECT {name} FROM {table} WHERE {name} > v.value"
        f" ORDER BY {name} LIMIT 1), v.n + 1 FROM v"
        f" WHERE v.value IS NOT NULL AND v.n < %s)"
        f" SELECT value FROM v WHERE value IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [limit])
        return [row[0] for row in cursor.fetchall()]


def estimated_task_count(using: str) -> int | None:
    """The planner's row count of the tasks table, or None where the database keeps none.

    SQL because the catalog estimate (pg_class.reltuples) is not a model.
    """
    if not dialect_of(using).has_row_estimate:
        return None
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
            [Task._meta.db_table],
        )
        row = cursor.fetchone()
    return max(0, int(row[0])) if row else None


def finished_since(using: str, queue: str, since_ms: int) -> dict[str, int]:
    """How many of the queue's tasks finished since `since_ms`, per terminal status.

    SQL because the status list must be literal: SQLite uses the partial
    (queue, completed_at_ms) index only when it can prove the query implies its
    predicate, and the ORM binds `status IN (...)` as parameters. Grouping the
    whole table by queue instead makes SQLite walk the claim index end to end.
    """
    statuses = ", ".join(f"'{status}'" for status in TERMINAL_STATUSES)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT status, count(*) FROM {Task._meta.db_table} WHERE queue = %s"
            f" AND status IN ({statuses}) AND completed_at_ms >= %s"
            f" GROUP BY status",
            [queue, since_ms],
        )
        return {status: int(n) for status, n in cursor.fetchall()}


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
        oldest = tasks.filter(queue=queue, status="queued", run_at_ms__lte=now).aggregate(
            oldest=Min("run_at_ms")
        )["oldest"]
        row.oldest_due_age_ms = None if oldest is None else max(0, now - oldest)
        row.finished_last_hour.update(finished_since(using, queue, now - HOUR_MS))
    return [rows[queue] for queue in sorted(rows)]
