"""The CairnQ operations over one Django database alias.

Statements run on Django's own connection for the alias, so a submit made inside
`transaction.atomic()` commits or rolls back with the caller's data. Write
sequences run in `transaction.atomic()` too: on SQLite that is BEGIN IMMEDIATE
(the app's system check insists on it), on Postgres a READ COMMITTED
transaction whose claims skip rows other workers have locked.

The raw SQL is deliberate: claim and settle are the hot path, and each is one
statement whose exact WHERE clause is part of the protocol (ownership checks,
cancel-wins, lease recovery). The ORM could express them only by re-reading.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections, transaction

from .. import jsoncodec
from ..errors import (
    AlreadyExists,
    CairnQError,
    LostLease,
    ProtocolVersionMismatch,
    SerializationError,
    error_envelope,
)
from ..ids import new_task_id, now_ms
from ..records import (
    CONFLICTS,
    STATUSES,
    TERMINAL_STATUSES,
    TaskRecord,
    TaskStatus,
)
from ..schema import PROTOCOL_VERSION
from ..jsoncodec import check_text, storable
from ..validators import (
    MAX_CORRELATION_ID_LENGTH,
    MAX_DELAY_MS,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_QUEUE_LENGTH,
    check_int32,
    check_label,
)
from .dialects import Dialect, dialect_for

try:
    from psycopg import ClientCursor as _ClientCursor
except ImportError:  # psycopg2, or no Postgres driver: the claim takes the usual path
    class _ClientCursor:  # type: ignore[no-redef]
        pass

_LEASE_EXPIRED = jsoncodec.dumps(
    error_envelope(
        type="LeaseExpired",
        code="lease_expired",
        message="task lease expired and max attempts reached",
        retryable=False,
    )
)

_INSERT_COLUMNS = (
    "id, name, queue, status, payload, metadata, max_attempts, priority, run_at_ms,"
    " parent_id, root_id, correlation_id, created_at_ms, updated_at_ms"
)

# The prepared-spec fields, in _INSERT_COLUMNS order (status and clocks aside).
_SPEC_COLUMNS = (
    "id", "name", "queue", "payload", "metadata", "max_attempts", "priority",
    "delay_ms", "parent_id", "root_id", "correlation_id",
)


def _inserted_record(spec: dict[str, Any], now: int) -> TaskRecord:
    """The row a fresh INSERT of `spec` at `now` holds, without reading it back."""
    return TaskRecord(
        id=spec["id"], name=spec["name"], queue=spec["queue"], status="queued",
        payload=jsoncodec.loads(spec["payload"]), result=None, error=None,
        metadata=jsoncodec.loads(spec["metadata"]), progress=None, message=None,
        attempt=0, max_attempts=spec["max_attempts"], priority=spec["priority"],
        worker_id=None, lease_until_ms=None, run_at_ms=now + spec["delay_ms"],
        cancel_requested_at_ms=None, parent_id=spec["parent_id"], root_id=spec["root_id"],
        correlation_id=spec["correlation_id"], created_at_ms=now, updated_at_ms=now,
        completed_at_ms=None,
    )


# Rows per grouped-completion statement on SQLite: 3 parameters each, well
# under SQLite's 32,766.
_SQLITE_GROUP_ROWS = 500

# From this many rows a Postgres batch goes through COPY; below it, one
# INSERT ... unnest() statement costs fewer round trips than COPY's two.
_COPY_MIN_ROWS = 200

_verified_aliases: set[str] = set()
_verify_lock = threading.Lock()


def _in(column: str, values: Sequence[Any], prefix: str, params: dict) -> str:
    """Return `column = x` or `column IN (...)`, binding each value by name.

    Inlined placeholders rather than an array/json_each parameter: the planner
    then sees an equality for the common single-queue/single-name case and can
    read the claim indexes in claim order without a sort.
    """
    names = []
    for i, value in enumerate(values):
        params[f"{prefix}{i}"] = value
        names.append(f"%({prefix}{i})s")
    if len(names) == 1:
        return f"{column} = {names[0]}"
    return f"{column} IN ({', '.join(names)})"


def _result_json(result: Any) -> str | None:
    """Encode a handler's result; None is stored as SQL NULL, as the peers store it."""
    return None if result is None else jsoncodec.dumps(result, what="result")


def _error_json(error: Any, retryable: bool) -> str:
    """Encode a failure record; one that is not storable JSON is cut down to its text fields.

    Raising here would leave the task running until its lease expired, over a
    detail nobody can store (an exception message holding a NUL, say).
    """
    try:
        return jsoncodec.dumps(error, what="error")
    except SerializationError:
        fields = error if isinstance(error, dict) else {}
        return jsoncodec.dumps(
            error_envelope(
                type=storable(str(fields.get("type", "Error"))),
                code=storable(str(fields.get("code", "handler_error"))),
                message=storable(str(fields.get("message", error if not fields else ""))),
                retryable=bool(retryable),
            )
        )


def _fetch_dicts(cursor) -> list[dict[str, Any]]:
    """The current result set as one dict per row ([] for a statement without rows)."""
    if cursor.description is None:
        return []
    columns = [c[0] for c in cursor.description]
    return [dict(zip(columns, row)) for row in cursor.fetchall()]


def _check_positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")


class Store:
    """Protocol operations on the CairnQ tables of one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.dialect: Dialect = dialect_for(connections[using].vendor)
        self._now = self.dialect.now
        self._row = self.dialect.task_columns()
        self._row_t = self.dialect.task_columns("t")

    # ---------------------------------------------------------------- plumbing
    def _rows(self, sql: str, params: dict | None = None) -> list[dict[str, Any]]:
        self._verify_protocol()
        params = self.dialect.bind_now(dict(params or {}))
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return _fetch_dicts(cursor)

    def _tasks(self, sql: str, params: dict | None = None) -> list[TaskRecord]:
        return [TaskRecord.from_row(row) for row in self._rows(sql, params)]

    def _task(self, sql: str, params: dict | None = None) -> TaskRecord | None:
        rows = self._tasks(sql, params)
        return rows[0] if rows else None

    def clock_ms(self) -> int:
        """Now in epoch ms from the queue's clock: the database's on PostgreSQL, this host's on SQLite."""
        if self.dialect.uses_process_clock:
            return now_ms()
        with connections[self.using].cursor() as cursor:
            cursor.execute(f"SELECT {self._now}")
            return int(cursor.fetchone()[0])

    def atomic(self):
        """A write transaction (or savepoint inside the caller's) on this alias."""
        return transaction.atomic(using=self.using)

    def _verify_protocol(self) -> None:
        if self.using in _verified_aliases:
            return
        with _verify_lock:
            if self.using in _verified_aliases:
                return
            try:
                with connections[self.using].cursor() as cursor:
                    cursor.execute(
                        "SELECT value FROM cairnq_meta WHERE key = 'protocol_version'"
                    )
                    row = cursor.fetchone()
            except Exception as exc:
                raise CairnQError(
                    f"The CairnQ tables are missing from database {self.using!r}; "
                    f"run `manage.py migrate cairnq_django --database {self.using}`. ({exc})"
                ) from exc
            if row is None or str(row[0]).split(".")[0] != str(PROTOCOL_VERSION):
                found = None if row is None else row[0]
                raise ProtocolVersionMismatch(
                    f"Database {self.using!r} speaks CairnQ protocol_version {found!r}; "
                    f"cairnq_django speaks {PROTOCOL_VERSION}."
                )
            _verified_aliases.add(self.using)

    def _lock_key(self, key: str) -> None:
        # The same advisory lock the other CairnQ implementations take, so
        # keyed submits from different languages serialize with each other.
        # SQLite needs none: BEGIN IMMEDIATE already holds the write lock.
        if self.dialect.vendor == "postgresql":
            self._rows("SELECT pg_advisory_xact_lock(hashtextextended(%(key)s::text, 0))", {"key": key})

    # ------------------------------------------------------------------ submit
    def prepare(
        self,
        name: str,
        payload: Any = None,
        *,
        queue: str = "default",
        max_attempts: int = 3,
        priority: int = 0,
        metadata: dict[str, Any] | None = None,
        correlation_id: str | None = None,
        delay_ms: int = 0,
        parent_id: str | None = None,
        root_id: str | None = None,
    ) -> dict[str, Any]:
        """Validate and encode one task for insertion; raises before any write."""
        check_label("Task name", name, MAX_NAME_LENGTH)
        check_label("Queue", queue, MAX_QUEUE_LENGTH)
        check_label("correlation_id", correlation_id, MAX_CORRELATION_ID_LENGTH, optional=True)
        check_label("parent_id", parent_id, MAX_CORRELATION_ID_LENGTH, optional=True)
        check_label("root_id", root_id, MAX_CORRELATION_ID_LENGTH, optional=True)
        check_int32("max_attempts", max_attempts, minimum=1)
        check_int32("priority", priority)
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or not (
            0 <= delay_ms <= MAX_DELAY_MS
        ):
            raise ValueError(f"delay_ms must be an integer from 0 to {MAX_DELAY_MS}, got {delay_ms!r}.")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}.")
        task_id = new_task_id()
        return {
            "id": task_id,
            "name": name,
            "queue": queue,
            "payload": jsoncodec.dumps({} if payload is None else payload, what="payload"),
            "metadata": jsoncodec.dumps(metadata or {}, what="metadata"),
            "max_attempts": max_attempts,
            "priority": priority,
            "delay_ms": delay_ms,
            "parent_id": parent_id,
            "root_id": root_id or task_id,
            "correlation_id": correlation_id,
        }

    def _insert(self, specs: Sequence[dict[str, Any]]) -> list[TaskRecord]:
        """Insert prepared tasks; build their records from the specs and the insert's clock.

        Only "now" comes back from the database: the rest of each row is what
        was just written, and reading it back (RETURNING *, decoding JSON a
        second time) cost about as much as the insert itself in a bulk enqueue.
        Placeholders are positional: SQLite resolves a named one by a linear
        scan, so a 500-row statement spent ~90% of its time binding 7,000
        names; Postgres gets the rows as arrays through unnest(), one short
        statement to parse and plan whatever the batch size.
        """
        if not specs:
            return []
        self._verify_protocol()
        with connections[self.using].cursor() as cursor:
            if self.dialect.vendor == "postgresql":
                now = self._insert_postgres(cursor, specs)
            else:
                now = self._insert_sqlite(cursor, specs)
        return [_inserted_record(spec, now) for spec in specs]

    def _insert_postgres(self, cursor, specs: Sequence[dict[str, Any]]) -> int:
        if len(specs) >= _COPY_MIN_ROWS and connections[self.using].in_atomic_block:
            copy = getattr(cursor.cursor, "copy", None)  # psycopg 3; psycopg2 has none
            if copy is not None:
                return self._copy_postgres(cursor, copy, specs)
        # The clock is read once in the FROM clause, so every row (and the
        # value returned) shares it.
        if len(specs) == 1:
            # One row: plain parameters. Dumping eleven one-element arrays
            # costs psycopg ~100 us, more than the statement saves.
            cursor.execute(
                f"INSERT INTO cairnq_tasks ({_INSERT_COLUMNS})"
                " SELECT %s, %s, %s, 'queued', %s::jsonb, %s::jsonb, %s, %s, c.now + %s,"
                " %s, %s, %s, c.now, c.now"
                f" FROM (SELECT {self._now} AS now) c RETURNING created_at_ms",
                [specs[0][c] for c in _SPEC_COLUMNS],
            )
            return cursor.fetchone()[0]
        columns = [[spec[c] for spec in specs] for c in _SPEC_COLUMNS]
        cursor.execute(
            f"INSERT INTO cairnq_tasks ({_INSERT_COLUMNS})"
            " SELECT u.id, u.name, u.queue, 'queued', u.payload::jsonb, u.metadata::jsonb,"
            " u.max_attempts, u.priority, c.now + u.delay_ms, u.parent_id, u.root_id,"
            " u.correlation_id, c.now, c.now"
            f" FROM (SELECT {self._now} AS now) c, unnest(%s::text[], %s::text[], %s::text[],"
            " %s::text[], %s::text[], %s::int[], %s::int[], %s::bigint[], %s::text[],"
            " %s::text[], %s::text[]) AS u(id, name, queue, payload, metadata, max_attempts,"
            " priority, delay_ms, parent_id, root_id, correlation_id)"
            " RETURNING created_at_ms",
            columns,
        )
        return cursor.fetchone()[0]

    def _copy_postgres(self, cursor, copy, specs: Sequence[dict[str, Any]]) -> int:
        """Stream a large batch through COPY: half the cost per row of unnest().

        COPY cannot compute columns, so the database clock is read first, in
        the same transaction, and every row gets it, as the INSERT would give
        them. Row triggers (the queued notification) fire for COPY as for
        INSERT. Only inside a transaction: the clock read and the rows must
        commit or roll back together with the caller's.
        """
        cursor.execute(f"SELECT {self._now}")
        now = cursor.fetchone()[0]
        with copy(f"COPY cairnq_tasks ({_INSERT_COLUMNS}) FROM STDIN") as stream:
            write = stream.write_row
            for spec in specs:
                write((
                    spec["id"], spec["name"], spec["queue"], "queued", spec["payload"],
                    spec["metadata"], spec["max_attempts"], spec["priority"],
                    now + spec["delay_ms"], spec["parent_id"], spec["root_id"],
                    spec["correlation_id"], now, now,
                ))
        return now

    def _insert_sqlite(self, cursor, specs: Sequence[dict[str, Any]]) -> int:
        now = now_ms()
        # The clock is bound, not inlined, so the statement text repeats and
        # sqlite3's statement cache skips re-compiling it (~45 us a row);
        # 1,000 rows x 14 values stays under SQLite's 32,766 parameters.
        row = "(%s, %s, %s, 'queued', %s, %s, %s, %s, %s + %s, %s, %s, %s, %s, %s)"
        for start in range(0, len(specs), 1000):
            chunk = specs[start : start + 1000]
            params = [
                value
                for spec in chunk
                for value in (
                    spec["id"], spec["name"], spec["queue"], spec["payload"], spec["metadata"],
                    spec["max_attempts"], spec["priority"], now, spec["delay_ms"],
                    spec["parent_id"], spec["root_id"], spec["correlation_id"], now, now,
                )
            ]
            cursor.execute(
                f"INSERT INTO cairnq_tasks ({_INSERT_COLUMNS}) VALUES "
                + ", ".join([row] * len(chunk)),
                params,
            )
        return now

    def submit(
        self,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        queue: str = "default",
        conflict: str = "reuse",
        max_attempts: int = 3,
        priority: int = 0,
        metadata: dict[str, Any] | None = None,
        correlation_id: str | None = None,
        delay_ms: int = 0,
        parent_id: str | None = None,
        root_id: str | None = None,
    ) -> TaskRecord:
        """Insert a queued task, resolving a business key by the conflict strategy."""
        if conflict not in CONFLICTS:
            raise ValueError(
                f"Unknown conflict strategy {conflict!r}; use one of {', '.join(CONFLICTS)}."
            )
        check_label("key", key, MAX_KEY_LENGTH, optional=True)
        spec = self.prepare(
            name, payload, queue=queue, max_attempts=max_attempts, priority=priority,
            metadata=metadata, correlation_id=correlation_id, delay_ms=delay_ms,
            parent_id=parent_id, root_id=root_id,
        )
        return self.submit_prepared(spec, key=key, conflict=conflict)

    def submit_prepared(
        self, spec: dict[str, Any], *, key: str | None = None, conflict: str = "reuse"
    ) -> TaskRecord:
        """Write a task validated by `prepare`."""
        if key is None:
            return self._insert([spec])[0]
        with self.atomic():
            return self._submit_keyed(spec, key, conflict)

    def _submit_keyed(self, spec: dict[str, Any], key: str, conflict: str) -> TaskRecord:
        self._lock_key(key)
        current = self._task(
            f"SELECT {self._row_t} FROM cairnq_task_keys k JOIN cairnq_tasks t"
            " ON t.id = k.task_id WHERE k.key = %(key)s",
            {"key": key},
        )
        # A purged task takes its key row with it (ON DELETE CASCADE), so
        # "no current task" covers both a fresh key and a freed one.
        if current is not None:
            if conflict == "reject":
                raise AlreadyExists(key)
            if conflict != "replace" and (
                not current.is_terminal
                or (conflict == "reuse-succeeded" and current.status == "succeeded")
            ):
                return current
            if not current.is_terminal:
                self._cancel_sql(current.id)
        task = self._insert([spec])[0]
        self._rows(
            "INSERT INTO cairnq_task_keys (key, task_id, created_at_ms, updated_at_ms)"
            f" VALUES (%(key)s, %(task_id)s, {self._now}, {self._now})"
            " ON CONFLICT (key) DO UPDATE SET task_id = excluded.task_id,"
            " updated_at_ms = excluded.updated_at_ms",
            {"key": key, "task_id": task.id},
        )
        return task

    def submit_many(
        self,
        specs: Sequence[dict[str, Any]],
        *,
        keys: Sequence[tuple[str | None, str]] | None = None,
        chunk_size: int = 5000,
    ) -> list[TaskRecord]:
        """Write prepared tasks (see `prepare`) in one transaction, in input order.

        `keys` gives a (key, conflict) pair per spec; unkeyed specs are inserted
        in multi-row statements, keyed ones one by one under their key lock.
        """
        keys = keys or [(None, "reuse")] * len(specs)
        results: list[TaskRecord | None] = [None] * len(specs)
        plain = [i for i, (key, _) in enumerate(keys) if key is None]
        with self.atomic():
            for start in range(0, len(plain), chunk_size):
                chunk = plain[start : start + chunk_size]
                by_id = {task.id: task for task in self._insert([specs[i] for i in chunk])}
                for i in chunk:
                    results[i] = by_id[specs[i]["id"]]
            for i, (key, conflict) in enumerate(keys):
                if key is not None:
                    results[i] = self._submit_keyed(specs[i], key, conflict)
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------- reads
    def get(self, task_id: str) -> TaskRecord | None:
        return self._task(
            f"SELECT {self._row} FROM cairnq_tasks WHERE id = %(id)s", {"id": task_id}
        )

    def get_by_key(self, key: str) -> TaskRecord | None:
        return self._task(
            f"SELECT {self._row_t} FROM cairnq_task_keys k JOIN cairnq_tasks t"
            " ON t.id = k.task_id WHERE k.key = %(key)s",
            {"key": key},
        )

    def get_status(self, task_id: str) -> TaskStatus | None:
        rows = self._rows("SELECT id, status FROM cairnq_tasks WHERE id = %(id)s", {"id": task_id})
        return TaskStatus(**rows[0]) if rows else None

    def get_status_by_key(self, key: str) -> TaskStatus | None:
        rows = self._rows(
            "SELECT t.id, t.status FROM cairnq_task_keys k JOIN cairnq_tasks t"
            " ON t.id = k.task_id WHERE k.key = %(key)s",
            {"key": key},
        )
        return TaskStatus(**rows[0]) if rows else None

    def list(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        name: str | None = None,
        root_id: str | None = None,
        correlation_id: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[TaskRecord]:
        if status is not None and status not in STATUSES:
            raise ValueError(f"Unknown status {status!r}; use one of {', '.join(STATUSES)}.")
        _check_positive("limit", limit, 0)
        _check_positive("offset", offset, 0)
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        where = []
        for column, value in (
            ("status", status), ("queue", queue), ("name", name),
            ("root_id", root_id), ("correlation_id", correlation_id),
        ):
            if value is not None:
                where.append(f"{column} = %({column})s")
                params[column] = value
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._tasks(
            f"SELECT {self._row} FROM cairnq_tasks{clause}"
            " ORDER BY created_at_ms DESC, id DESC LIMIT %(limit)s OFFSET %(offset)s",
            params,
        )

    def stats(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        params: dict[str, Any] = {}
        clause = ""
        if queue is not None:
            clause = " WHERE queue = %(queue)s"
            params["queue"] = queue
        rows = self._rows(
            f"SELECT queue, status, count(*) AS n FROM cairnq_tasks{clause} GROUP BY queue, status",
            params,
        )
        result: dict[str, dict[str, int]] = {}
        if queue is not None:
            result[queue] = dict.fromkeys(STATUSES, 0)
        for row in rows:
            result.setdefault(row["queue"], dict.fromkeys(STATUSES, 0))[row["status"]] = int(row["n"])
        return dict(sorted(result.items()))

    def queue_depth(self, queue: str, max_depth: int) -> int:
        """Headroom under max_depth queued tasks, reading at most max_depth rows."""
        _check_positive("max_depth", max_depth)
        rows = self._rows(
            "SELECT count(*) AS n FROM (SELECT 1 FROM cairnq_tasks"
            " WHERE queue = %(queue)s AND status = 'queued' LIMIT %(max_depth)s) probe",
            {"queue": queue, "max_depth": max_depth},
        )
        return max(0, max_depth - int(rows[0]["n"]))

    # ---------------------------------------------------------------- control
    def _cancel_sql(self, task_id: str) -> TaskRecord | None:
        now = self._now
        return self._task(
            "UPDATE cairnq_tasks SET"
            " status = CASE WHEN status = 'queued' THEN 'canceled' ELSE status END,"
            f" cancel_requested_at_ms = CASE WHEN status = 'running' THEN {now}"
            " ELSE cancel_requested_at_ms END,"
            f" completed_at_ms = CASE WHEN status = 'queued' THEN {now} ELSE completed_at_ms END,"
            f" updated_at_ms = {now}"
            f" WHERE id = %(id)s AND status IN ('queued', 'running') RETURNING {self._row}",
            {"id": task_id},
        )

    def _retry_sql(self, task_id: str, reset_attempt: bool) -> TaskRecord | None:
        now = self._now
        return self._task(
            "UPDATE cairnq_tasks SET status = 'queued', error = NULL, worker_id = NULL,"
            f" lease_until_ms = NULL, run_at_ms = {now}, cancel_requested_at_ms = NULL,"
            " completed_at_ms = NULL, progress = NULL, message = NULL,"
            " attempt = CASE WHEN %(reset)s THEN 0 ELSE attempt END,"
            f" updated_at_ms = {now}"
            f" WHERE id = %(id)s AND status IN ('failed', 'canceled') RETURNING {self._row}",
            {"id": task_id, "reset": bool(reset_attempt)},
        )

    def cancel(self, task_id: str) -> TaskRecord | None:
        """queued -> canceled; running -> cancel requested. None if neither applies."""
        return self._cancel_sql(task_id)

    def retry(self, task_id: str, *, reset_attempt: bool = False) -> TaskRecord | None:
        """failed/canceled -> queued. None if the task is not in one of those states."""
        return self._retry_sql(task_id, reset_attempt)

    def _by_key(self, key: str, action) -> TaskRecord | None:
        with self.atomic():
            self._lock_key(key)
            rows = self._rows(
                "SELECT task_id FROM cairnq_task_keys WHERE key = %(key)s", {"key": key}
            )
            return action(rows[0]["task_id"]) if rows else None

    def cancel_by_key(self, key: str) -> TaskRecord | None:
        return self._by_key(key, self._cancel_sql)

    def retry_by_key(self, key: str, *, reset_attempt: bool = False) -> TaskRecord | None:
        return self._by_key(key, lambda task_id: self._retry_sql(task_id, reset_attempt))

    def purge(
        self,
        *,
        older_than_ms: int = 0,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
        limit: int = 1000,
    ) -> list[str]:
        """Delete up to `limit` terminal tasks completed over older_than_ms ago, oldest first."""
        _check_positive("older_than_ms", older_than_ms, 0)
        _check_positive("limit", limit)
        if status is not None and status not in TERMINAL_STATUSES:
            raise ValueError(
                f"purge only deletes finished tasks; status must be one of "
                f"{', '.join(TERMINAL_STATUSES)}, not {status!r}."
            )
        params: dict[str, Any] = {"older_than_ms": older_than_ms, "limit": limit}
        # The literal terminal-status list matches the partial purge index's predicate.
        where = ["status IN ('succeeded', 'failed', 'canceled')"]
        for column, value in (("queue", queue), ("status", status), ("name", name)):
            if value is not None:
                where.append(f"{column} = %({column})s")
                params[column] = value
        where.append("completed_at_ms IS NOT NULL")
        where.append(f"completed_at_ms < {self._now} - %(older_than_ms)s")
        rows = self._rows(
            "DELETE FROM cairnq_tasks WHERE id IN (SELECT id FROM cairnq_tasks"
            f" WHERE {' AND '.join(where)} ORDER BY completed_at_ms ASC LIMIT %(limit)s"
            f"{self.dialect.skip_locked}) RETURNING id, completed_at_ms",
            params,
        )
        # RETURNING follows the delete's scan order, not the subselect's ORDER BY.
        rows.sort(key=lambda row: (row["completed_at_ms"], row["id"]))
        return [row["id"] for row in rows]

    def purge_ids(self, task_ids: Sequence[str], *, chunk_size: int = 500) -> list[str]:
        """Delete the finished tasks among `task_ids`, keeping live ones; return the deleted ids.

        Each chunk is its own short statement, so a large selection never holds
        the write lock for long.
        """
        _check_positive("chunk_size", chunk_size)
        task_ids = list(dict.fromkeys(task_ids))
        deleted: list[str] = []
        for start in range(0, len(task_ids), chunk_size):
            params: dict[str, Any] = {}
            ids = _in("id", task_ids[start : start + chunk_size], "i", params)
            rows = self._rows(
                f"DELETE FROM cairnq_tasks WHERE {ids}"
                " AND status IN ('succeeded', 'failed', 'canceled') RETURNING id",
                params,
            )
            deleted += [row["id"] for row in rows]
        return deleted

    # ------------------------------------------------------------------ worker
    def has_claimable(self, *, queues: Sequence[str], names: Sequence[str] | None = None) -> bool:
        """Read-only probe: is there due work (or an expired lease) worth a claim?"""
        if names is not None and not names:
            return False
        params: dict[str, Any] = {}
        queued = ["status = 'queued'", _in("queue", list(queues), "q", params)]
        if names is not None:
            queued.append(_in("name", list(names), "n", params))
        queued.append(f"run_at_ms <= {self._now}")
        rows = self._rows(
            f"SELECT EXISTS (SELECT 1 FROM cairnq_tasks WHERE {' AND '.join(queued)}) AS work,"
            " EXISTS (SELECT 1 FROM cairnq_tasks WHERE status = 'running'"
            f" AND lease_until_ms IS NOT NULL AND lease_until_ms <= {self._now}) AS expired",
            params,
        )
        return bool(rows[0]["work"]) or bool(rows[0]["expired"])

    def recover_leases(self) -> list[TaskRecord]:
        """Settle every task whose lease expired; run inside the claim transaction."""
        return self._tasks(self._recover_sql() + f" RETURNING {self._row}", {"lease_error": _LEASE_EXPIRED})

    def _recover_sql(self) -> str:
        now = self._now
        requeue = "cancel_requested_at_ms IS NULL AND attempt < max_attempts"
        j = self.dialect.json.format(name="lease_error")
        return (
            "UPDATE cairnq_tasks SET"
            " status = CASE WHEN cancel_requested_at_ms IS NOT NULL THEN 'canceled'"
            " WHEN attempt < max_attempts THEN 'queued' ELSE 'failed' END,"
            f" worker_id = CASE WHEN {requeue} THEN NULL ELSE worker_id END,"
            " lease_until_ms = NULL,"
            f" run_at_ms = CASE WHEN {requeue} THEN {now} ELSE run_at_ms END,"
            " error = CASE WHEN cancel_requested_at_ms IS NULL AND attempt >= max_attempts"
            f" THEN {j} ELSE error END,"
            f" completed_at_ms = CASE WHEN {requeue} THEN completed_at_ms ELSE {now} END,"
            f" progress = CASE WHEN {requeue} THEN NULL ELSE progress END,"
            f" message = CASE WHEN {requeue} THEN NULL ELSE message END,"
            f" updated_at_ms = {now}"
            " WHERE id IN (SELECT id FROM cairnq_tasks WHERE status = 'running'"
            f" AND lease_until_ms IS NOT NULL AND lease_until_ms <= {now}"
            f"{self.dialect.skip_locked})"
        )

    def _claim_sql(
        self, queues: Sequence[str], names: Sequence[str] | None, params: dict
    ) -> str:
        now = self._now
        where = ["status = 'queued'", _in("queue", list(queues), "q", params)]
        if names is not None:
            where.append(_in("name", list(names), "n", params))
        where.append(f"run_at_ms <= {now}")
        return (
            "UPDATE cairnq_tasks SET status = 'running', worker_id = %(worker_id)s,"
            f" lease_until_ms = {now} + %(lease_ms)s, attempt = attempt + 1,"
            f" updated_at_ms = {now}"
            " WHERE id IN (SELECT id FROM cairnq_tasks"
            f" WHERE {' AND '.join(where)}"
            " ORDER BY priority DESC, run_at_ms ASC, id ASC LIMIT %(limit)s"
            f"{self.dialect.skip_locked}) RETURNING {self._row}"
        )

    def claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = 30000,
        limit: int = 1,
        names: Sequence[str] | None = None,
        draws: Iterable[tuple[Sequence[str] | None, int]] | None = None,
    ) -> list[TaskRecord]:
        """Recover expired leases, then take up to `limit` due tasks, in one transaction.

        `draws` lets a worker take several per-name quotas in the same
        transaction: each (names, limit) pair is one claim statement.
        """
        if isinstance(queues, str):
            queues = [queues]
        if not queues:
            raise ValueError("claim needs at least one queue.")
        _check_positive("lease_ms", lease_ms)
        _check_positive("limit", limit, 0)
        plan = [
            (draw_names, draw_limit)
            for draw_names, draw_limit in (list(draws) if draws is not None else [(names, limit)])
            if draw_limit > 0 and (draw_names is None or draw_names)
        ]
        claimed = None
        if self.dialect.vendor == "postgresql" and len(plan) == 1:
            claimed = self._claim_one_round_trip(queues, worker_id, lease_ms, *plan[0])
        if claimed is None:
            claimed = self._claim_in_transaction(queues, worker_id, lease_ms, plan)
        claimed.sort(key=lambda t: (-t.priority, t.run_at_ms, t.id))
        return claimed

    def _claim_in_transaction(self, queues, worker_id, lease_ms, plan) -> list[TaskRecord]:
        claimed: list[TaskRecord] = []
        with self.atomic():
            self.recover_leases()
            for draw_names, draw_limit in plan:  # already free of empty draws
                params = {"worker_id": worker_id, "lease_ms": lease_ms, "limit": draw_limit}
                claimed += self._tasks(self._claim_sql(queues, draw_names, params), params)
        return claimed

    def _claim_one_round_trip(
        self,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int,
        names: Sequence[str] | None,
        limit: int,
    ) -> list[TaskRecord] | None:
        """Postgres: recover and claim as one two-statement query, one round trip.

        Postgres runs the statements of one simple-protocol query as a single
        transaction, and the second (the claim) sees what the first (the
        recovery) requeued, so this is the protocol's claim transaction
        without the BEGIN and COMMIT round trips. Only client-side binding
        (Django's default) can send two statements at once; with
        server_side_binding, or inside a caller's transaction, this returns
        None and the claim runs as usual.
        """
        connection = connections[self.using]
        if connection.in_atomic_block:
            return None
        params = {
            "worker_id": worker_id, "lease_ms": lease_ms, "limit": limit,
            "lease_error": _LEASE_EXPIRED,
        }
        claim = self._claim_sql(queues, names, params)
        self._verify_protocol()
        with connection.cursor() as cursor:
            if not isinstance(cursor.cursor, _ClientCursor):
                return None
            cursor.execute(f"{self._recover_sql()}; {claim}", params)
            cursor.nextset()
            return [TaskRecord.from_row(row) for row in _fetch_dicts(cursor)]

    def _owned(self, set_clause: str, task_id: str, worker_id: str, params: dict) -> TaskRecord:
        params.update(id=task_id, worker_id=worker_id)
        task = self._task(
            f"UPDATE cairnq_tasks SET {set_clause}, updated_at_ms = {self._now}"
            " WHERE id = %(id)s AND status = 'running' AND worker_id = %(worker_id)s"
            f" AND lease_until_ms > {self._now} RETURNING {self._row}",
            params,
        )
        if task is None:
            raise LostLease(task_id)
        return task

    def heartbeat(self, task_id: str, worker_id: str, lease_ms: int) -> TaskRecord:
        _check_positive("lease_ms", lease_ms)
        return self._owned(
            f"lease_until_ms = {self._now} + %(lease_ms)s", task_id, worker_id,
            {"lease_ms": lease_ms},
        )

    def heartbeat_batch(
        self, task_ids: Sequence[str], worker_id: str, lease_ms: int
    ) -> dict[str, bool]:
        """Renew every lease still held; answer {id: cancel_requested} for those rows."""
        _check_positive("lease_ms", lease_ms)
        if not task_ids:
            return {}
        params: dict[str, Any] = {"worker_id": worker_id, "lease_ms": lease_ms}
        ids = _in("id", list(task_ids), "i", params)
        rows = self._rows(
            f"UPDATE cairnq_tasks SET lease_until_ms = {self._now} + %(lease_ms)s,"
            f" updated_at_ms = {self._now}"
            f" WHERE {ids} AND status = 'running' AND worker_id = %(worker_id)s"
            f" AND lease_until_ms > {self._now} RETURNING id, cancel_requested_at_ms",
            params,
        )
        held = {row["id"]: row["cancel_requested_at_ms"] is not None for row in rows}
        return {task_id: held[task_id] for task_id in task_ids if task_id in held}

    def progress(
        self,
        task_id: str,
        worker_id: str,
        progress: float | None = None,
        message: str | None = None,
    ) -> TaskRecord:
        if progress is not None:
            if isinstance(progress, bool) or not isinstance(progress, (int, float)) or not (
                0.0 <= progress <= 1.0
            ):
                raise ValueError(f"progress must be a number from 0 to 1, got {progress!r}.")
            progress = float(progress)
        if message is not None:
            if not isinstance(message, str):
                raise ValueError(f"message must be a string, got {message!r}.")
            check_text(message, what="progress message")
        return self._owned(
            "progress = COALESCE(%(progress)s, progress), message = COALESCE(%(message)s, message)",
            task_id, worker_id, {"progress": progress, "message": message},
        )

    def succeed(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """running -> succeeded with result (ignores a pending cancel; see complete)."""
        j = self.dialect.json.format(name="result")
        return self._owned(
            f"status = 'succeeded', result = {j}, progress = 1.0, lease_until_ms = NULL,"
            f" completed_at_ms = {self._now}",
            task_id, worker_id, {"result": _result_json(result)},
        )

    def _complete_set(self, result_sql: str | None = None) -> str:
        j = result_sql or self.dialect.json.format(name="result")
        cancel = "cancel_requested_at_ms IS NOT NULL"
        return (
            f"status = CASE WHEN {cancel} THEN 'canceled' ELSE 'succeeded' END,"
            f" result = CASE WHEN {cancel} THEN result ELSE {j} END,"
            f" progress = CASE WHEN {cancel} THEN progress ELSE 1.0 END,"
            f" lease_until_ms = NULL, completed_at_ms = {self._now}"
        )

    def complete(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """Finish a run: succeeded with result, or canceled if a cancel is pending."""
        return self._owned(
            self._complete_set(), task_id, worker_id, {"result": _result_json(result)}
        )

    @staticmethod
    def encode_result(result: Any) -> str | None:
        """The stored form of a handler's result; raises SerializationError before any write."""
        return _result_json(result)

    def complete_encoded_many(
        self, items: Sequence[tuple[str, str, str | None]]
    ) -> list[TaskRecord | None]:
        """Complete several runs in ONE transaction; None where the lease was no longer held.

        Each item is (task_id, worker_id, result encoded by encode_result).
        Every row keeps complete()'s own ownership check, so one lost lease
        settles nothing else wrongly; the saving is the commit, one per group
        instead of one per task.
        """
        if not items:
            return []
        if self.dialect.vendor == "postgresql":
            rows = self._complete_many_postgres(items)
        else:
            rows = []
            with self.atomic():
                for start in range(0, len(items), _SQLITE_GROUP_ROWS):
                    rows += self._complete_many_sqlite(items[start : start + _SQLITE_GROUP_ROWS])
        by_id = {row.id: row for row in rows}
        return [by_id.get(task_id) for task_id, _, _ in items]

    def _complete_many_sqlite(
        self, items: Sequence[tuple[str, str, str | None]]
    ) -> list[TaskRecord]:
        # One UPDATE ... FROM a VALUES list (SQLite 3.33+): a statement per
        # row spent more in Django's cursor than in SQLite.
        params: dict[str, Any] = {}
        values = []
        for i, (task_id, worker_id, result_json) in enumerate(items):
            params[f"i{i}"], params[f"w{i}"], params[f"r{i}"] = task_id, worker_id, result_json
            values.append(f"(%(i{i})s, %(w{i})s, %(r{i})s)")
        return self._tasks(
            f"UPDATE cairnq_tasks SET {self._complete_set('u.result_json')},"
            f" updated_at_ms = {self._now}"
            " FROM (SELECT column1 AS task_id, column2 AS owner, column3 AS result_json"
            f" FROM (VALUES {', '.join(values)})) AS u"
            " WHERE id = u.task_id AND status = 'running' AND worker_id = u.owner"
            f" AND lease_until_ms > {self._now} RETURNING {self._row}",
            params,
        )

    def _complete_many_postgres(
        self, items: Sequence[tuple[str, str, str | None]]
    ) -> list[TaskRecord]:
        # One UPDATE joined to the group as arrays: one round trip and, in
        # autocommit, one commit for the whole group.
        ids, owners, results = (list(column) for column in zip(*items))
        now = self._now
        return self._tasks(
            f"UPDATE cairnq_tasks SET {self._complete_set('u.result_json::jsonb')},"
            f" updated_at_ms = c.now FROM (SELECT {now} AS now) c,"
            " unnest(%(ids)s::text[], %(owners)s::text[], %(results)s::text[])"
            " AS u(task_id, owner, result_json)"
            " WHERE id = u.task_id AND status = 'running' AND worker_id = u.owner"
            f" AND lease_until_ms > c.now RETURNING {self.dialect.task_columns('cairnq_tasks')}",
            {"ids": ids, "owners": owners, "results": results},
        )

    def fail(
        self,
        task_id: str,
        worker_id: str,
        error: Any,
        retryable: bool = True,
        delay_ms: int = 0,
    ) -> TaskRecord:
        """Requeue (retryable, attempts left), fail terminally, or cancel if requested."""
        _check_positive("delay_ms", delay_ms, 0)
        if isinstance(error, BaseException):
            error = error_envelope(
                type=type(error).__name__, code="handler_error", message=str(error),
                retryable=retryable,
            )
        elif isinstance(error, str):
            error = error_envelope(
                type="Error", code="handler_error", message=error, retryable=retryable
            )
        now = self._now
        j = self.dialect.json.format(name="error")
        requeue = "cancel_requested_at_ms IS NULL AND %(retryable)s AND attempt < max_attempts"
        return self._owned(
            "status = CASE WHEN cancel_requested_at_ms IS NOT NULL THEN 'canceled'"
            " WHEN %(retryable)s AND attempt < max_attempts THEN 'queued' ELSE 'failed' END,"
            f" error = {j},"
            f" worker_id = CASE WHEN {requeue} THEN NULL ELSE worker_id END,"
            " lease_until_ms = NULL,"
            f" run_at_ms = CASE WHEN {requeue} THEN {now} + %(delay_ms)s ELSE run_at_ms END,"
            f" completed_at_ms = CASE WHEN {requeue} THEN NULL ELSE {now} END,"
            f" progress = CASE WHEN {requeue} THEN NULL ELSE progress END,"
            f" message = CASE WHEN {requeue} THEN NULL ELSE message END",
            task_id, worker_id,
            {
                "error": _error_json(error, retryable),
                "retryable": bool(retryable),
                "delay_ms": delay_ms,
            },
        )


_stores: dict[str, Store] = {}


def get_store(using: str | None = None) -> Store:
    """Return the store for a database alias (default: settings.CAIRNQ['DATABASE'])."""
    if using is None:
        from ..conf import cairnq_settings

        using = cairnq_settings.DATABASE
    store = _stores.get(using)
    if store is None:
        store = _stores[using] = Store(using)
    return store
