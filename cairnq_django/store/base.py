"""The CairnQ operations over one Django database alias.

Statements run on Django's own connection for the alias, so a submit made inside
`transaction.atomic()` commits or rolls back with the caller's data. Write
sequences run in `transaction.atomic()` too: on SQLite that is BEGIN IMMEDIATE
(the app's system check insists on it), on Postgres a READ COMMITTED
transaction whose claims skip rows other workers have locked.

Each statement is an ORM QuerySet: the WHERE from querysets.TaskQuerySet (the
protocol's queries), the SET from transitions.py; statements.py compiles it
once per shape. sql.py holds the few statements the ORM cannot express.
"""

from __future__ import annotations

import builtins  # Store.list() shadows `list` in the annotations of the methods after it
import threading
from collections.abc import Iterable, Sequence
from typing import Any, cast

from django.db import connections, transaction
from django.db.models import Case, Count, Exists, QuerySet, Value, When
from django.db.models.constants import OnConflict

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
from ..jsoncodec import check_text, storable
from ..querysets import TaskQuerySet, one_of
from ..records import (
    COLUMNS,
    DEFAULT_CONFLICT,
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    JSON_COLUMNS,
    STATUSES,
    TERMINAL_STATUSES,
    TaskRecord,
    TaskStatus,
)
from ..schema import PROTOCOL_VERSION
from ..validators import (
    MAX_CORRELATION_ID_LENGTH,
    MAX_DELAY_MS,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_QUEUE_LENGTH,
    check_conflict,
    check_int32,
    check_integer,
    check_label,
)
from . import sql, transitions
from .dialects import RAW_TEXT_COLUMNS, Dialect, dialect_of
from .expressions import JsonParam, LiteralIn, NowMs, RawText, int_param, now_plus, text_param
from .statements import (
    Statement,
    Template,
    delete_sql,
    insert_sql,
    returning_columns,
    select_sql,
    update_sql,
)

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


# Rows per multi-row INSERT: 14 values each stays under SQLite's 32,766
# parameters, and the statement text repeats, so it is compiled once.
_INSERT_ROWS = 1000

# Rows per grouped-completion statement: 3 parameters each.
_GROUP_ROWS = 500

# From this many rows a Postgres batch goes through COPY; below it, one
# multi-row INSERT costs fewer round trips than COPY's two.
_COPY_MIN_ROWS = 200

_verified_aliases: set[str] = set()
_verify_lock = threading.Lock()


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


class Store:
    """Protocol operations on the CairnQ tables of one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.dialect: Dialect = dialect_of(using)

    # ---------------------------------------------------------------- plumbing
    def _run(self, statement: Statement, values: dict | None = None, shape: tuple = (),
             rows: Sequence[dict] = (), now: int | None = None) -> list[tuple]:
        self._verify_protocol()
        if self.dialect.has_row_locks and not statement.compiled(self.using, shape):
            # Django compiles select_for_update() only inside a transaction.
            with transaction.atomic(using=self.using):
                statement.template(self.using, shape)
        sql, params = statement.bind(self.using, values or {}, shape, rows, now)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []

    def _tasks(self, statement: Statement, values: dict | None = None, shape: tuple = (),
               rows: Sequence[dict] = ()) -> list[TaskRecord]:
        return [_record(row) for row in self._run(statement, values, shape, rows)]

    def _task(self, statement: Statement, values: dict | None = None, shape: tuple = ()) -> TaskRecord | None:
        found = self._tasks(statement, values, shape)
        return found[0] if found else None

    def _fetch(self, queryset: QuerySet) -> list[TaskRecord]:
        """Evaluate a task QuerySet of this alias into records, columns read as the codec needs."""
        self._verify_protocol()
        sql, params = select_sql(_task_columns(queryset, self.dialect))
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return [_record(row) for row in cursor.fetchall()]

    def tasks(self) -> TaskQuerySet:
        """The Task QuerySet of this alias (querysets.TaskQuerySet)."""
        return _tasks_of(self.using)

    def clock_ms(self) -> int:
        """Now in epoch ms from the queue's clock: the database's on PostgreSQL, this host's on SQLite."""
        if self.dialect.uses_process_clock:
            return now_ms()
        connection = connections[self.using]
        expression, params = NowMs().as_postgresql(None, connection)
        with connection.cursor() as cursor:
            cursor.execute(sql.SELECT_VALUE.format(expression=expression), params)
            return int(cursor.fetchone()[0])

    def refresh_statistics(self) -> None:
        """Let the database refresh its planner statistics where it keeps them stale (SQLite)."""
        if self.dialect.needs_periodic_analyze:
            self._verify_protocol()
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql.OPTIMIZE)

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
                found = (
                    _models().ProtocolMeta.objects.using(self.using)
                    .filter(key="protocol_version").values_list("value", flat=True).first()
                )
            except Exception as exc:
                raise CairnQError(
                    f"The CairnQ tables are missing from database {self.using!r}; "
                    f"run `manage.py migrate cairnq_django --database {self.using}`. ({exc})"
                ) from exc
            if found is None or str(found).split(".")[0] != str(PROTOCOL_VERSION):
                raise ProtocolVersionMismatch(
                    f"Database {self.using!r} speaks CairnQ protocol_version {found!r}; "
                    f"cairnq_django speaks {PROTOCOL_VERSION}."
                )
            _verified_aliases.add(self.using)

    def _lock_key(self, key: str) -> None:
        # SQLite needs none: BEGIN IMMEDIATE already holds the write lock.
        if self.dialect.has_advisory_locks:
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql.LOCK_KEY, [key])

    # ------------------------------------------------------------------ submit
    def prepare(
        self,
        name: str,
        payload: Any = None,
        *,
        queue: str = DEFAULT_QUEUE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = DEFAULT_PRIORITY,
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
        was just written, and reading it back would decode every JSON value a
        second time.
        """
        if not specs:
            return []
        self._verify_protocol()
        connection = connections[self.using]
        if (self.dialect.has_copy and len(specs) >= _COPY_MIN_ROWS
                and connection.in_atomic_block):
            with connection.cursor() as cursor:
                copy = getattr(cursor.cursor, "copy", None)  # psycopg 3; psycopg2 has none
                if copy is not None:
                    copied_at = self.clock_ms()
                    sql.copy_rows(copy, specs, copied_at)
                    return [_inserted_record(spec, copied_at) for spec in specs]
        now = now_ms() if self.dialect.uses_process_clock else None
        for start in range(0, len(specs), _INSERT_ROWS):
            chunk = specs[start : start + _INSERT_ROWS]
            found = self._run(_INSERT, shape=(len(chunk),), rows=chunk, now=now)
            if now is None:
                now = found[0][0]
        # `now` is still None here only when there were no specs.
        return [_inserted_record(spec, cast(int, now)) for spec in specs]

    def submit(
        self,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        queue: str = DEFAULT_QUEUE,
        conflict: str = DEFAULT_CONFLICT,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = DEFAULT_PRIORITY,
        metadata: dict[str, Any] | None = None,
        correlation_id: str | None = None,
        delay_ms: int = 0,
        parent_id: str | None = None,
        root_id: str | None = None,
    ) -> TaskRecord:
        """Insert a queued task, resolving a business key by the conflict strategy."""
        check_conflict(conflict)
        check_label("key", key, MAX_KEY_LENGTH, optional=True)
        spec = self.prepare(
            name, payload, queue=queue, max_attempts=max_attempts, priority=priority,
            metadata=metadata, correlation_id=correlation_id, delay_ms=delay_ms,
            parent_id=parent_id, root_id=root_id,
        )
        return self.submit_prepared(spec, key=key, conflict=conflict)

    def submit_prepared(
        self, spec: dict[str, Any], *, key: str | None = None, conflict: str = DEFAULT_CONFLICT
    ) -> TaskRecord:
        """Write a task validated by `prepare`."""
        if key is None:
            return self._insert([spec])[0]
        with self.atomic():
            return self._submit_keyed(spec, key, conflict)

    def _submit_keyed(self, spec: dict[str, Any], key: str, conflict: str) -> TaskRecord:
        self._lock_key(key)
        current = self._task(_BY_KEY, {"key": key})
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
                self._cancel(current.id)
        task = self._insert([spec])[0]
        self._run(_POINT_KEY, {"key": key, "task_id": task.id})
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
        keys = keys or [(None, DEFAULT_CONFLICT)] * len(specs)
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
        return self._task(_GET, {"id": task_id})

    def get_by_key(self, key: str) -> TaskRecord | None:
        return self._task(_BY_KEY, {"key": key})

    def get_status(self, task_id: str) -> TaskStatus | None:
        rows = self._run(_STATUS, {"id": task_id})
        return TaskStatus(id=rows[0][0], status=rows[0][1]) if rows else None

    def get_status_by_key(self, key: str) -> TaskStatus | None:
        rows = self._run(_STATUS_BY_KEY, {"key": key})
        return TaskStatus(id=rows[0][0], status=rows[0][1]) if rows else None

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
    ) -> builtins.list[TaskRecord]:
        if status is not None and status not in STATUSES:
            raise ValueError(f"Unknown status {status!r}; use one of {', '.join(STATUSES)}.")
        check_integer("limit", limit, minimum=0)
        check_integer("offset", offset, minimum=0)
        filters = {
            field: value
            for field, value in (
                ("status", status), ("queue", queue), ("name", name),
                ("root_id", root_id), ("correlation_id", correlation_id),
            )
            if value is not None
        }
        if limit == 0:
            return []
        return self._fetch(self.tasks().filter(**filters).newest_first()[offset : offset + limit])

    def stats(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        self._verify_protocol()
        tasks = self.tasks() if queue is None else self.tasks().filter(queue=queue)
        result: dict[str, dict[str, int]] = {}
        if queue is not None:
            result[queue] = dict.fromkeys(STATUSES, 0)
        for row in tasks.order_by().values("queue", "status").annotate(n=Count("*")):
            result.setdefault(row["queue"], dict.fromkeys(STATUSES, 0))[row["status"]] = int(row["n"])
        return dict(sorted(result.items()))

    def queue_depth(self, queue: str, max_depth: int) -> int:
        """Headroom under max_depth queued tasks, reading at most max_depth rows."""
        check_integer("max_depth", max_depth)
        self._verify_protocol()
        queued = self.tasks().filter(queue=queue, status="queued").order_by()[:max_depth]
        return max(0, max_depth - queued.count())

    # ---------------------------------------------------------------- control
    def _cancel(self, task_id: str) -> TaskRecord | None:
        return self._task(_CANCEL, {"id": task_id})

    def _retry(self, task_id: str, reset_attempt: bool) -> TaskRecord | None:
        return self._task(_RETRY, {"id": task_id, "reset": bool(reset_attempt)})

    def cancel(self, task_id: str) -> TaskRecord | None:
        """queued -> canceled; running -> cancel requested. None if neither applies."""
        return self._cancel(task_id)

    def retry(self, task_id: str, *, reset_attempt: bool = False) -> TaskRecord | None:
        """failed/canceled -> queued. None if the task is not in one of those states."""
        return self._retry(task_id, reset_attempt)

    def _by_key(self, key: str, action) -> TaskRecord | None:
        with self.atomic():
            self._lock_key(key)
            rows = self._run(_KEY_TARGET, {"key": key})
            return action(rows[0][0]) if rows else None

    def cancel_by_key(self, key: str) -> TaskRecord | None:
        return self._by_key(key, self._cancel)

    def retry_by_key(self, key: str, *, reset_attempt: bool = False) -> TaskRecord | None:
        return self._by_key(key, lambda task_id: self._retry(task_id, reset_attempt))

    def purge(
        self,
        *,
        older_than_ms: int = 0,
        queue: str | None = None,
        status: str | None = None,
        name: str | None = None,
        limit: int = 1000,
    ) -> builtins.list[str]:
        """Delete up to `limit` terminal tasks completed over older_than_ms ago, oldest first."""
        check_integer("older_than_ms", older_than_ms, minimum=0)
        check_integer("limit", limit)
        if status is not None and status not in TERMINAL_STATUSES:
            raise ValueError(
                f"purge only deletes finished tasks; status must be one of "
                f"{', '.join(TERMINAL_STATUSES)}, not {status!r}."
            )
        values = {"older_than_ms": older_than_ms, "queue": queue, "status": status, "name": name}
        shape = (limit, queue is not None, status is not None, name is not None)
        rows = self._run(_PURGE, values, shape)
        # RETURNING follows the delete's scan order, not the subselect's ORDER BY.
        rows.sort(key=lambda row: (row[1], row[0]))
        return [row[0] for row in rows]

    def count_purgeable(self, *, older_than_ms: int = 0, queue: str | None = None,
                        status: str | None = None, name: str | None = None) -> int:
        """How many tasks purge() with these arguments would delete, all batches together."""
        self._verify_protocol()
        return self.tasks().purgeable(older_than_ms, queue=queue, status=status, name=name).count()

    def purge_ids(self, task_ids: Sequence[str], *, chunk_size: int = 500) -> builtins.list[str]:
        """Delete the finished tasks among `task_ids`, keeping live ones; return the deleted ids.

        Each chunk is its own short statement, so a large selection never holds
        the write lock for long.
        """
        check_integer("chunk_size", chunk_size)
        task_ids = list(dict.fromkeys(task_ids))
        deleted: list[str] = []
        for start in range(0, len(task_ids), chunk_size):
            chunk = [{"id": task_id} for task_id in task_ids[start : start + chunk_size]]
            deleted += [row[0] for row in self._run(_PURGE_IDS, shape=(len(chunk),), rows=chunk)]
        return deleted

    # ------------------------------------------------------------------ worker
    def has_claimable(self, *, queues: Sequence[str], names: Sequence[str] | None = None) -> bool:
        """Read-only probe: is there due work (or an expired lease) worth a claim?"""
        if names is not None and not names:
            return False
        rows = self._run(
            _HAS_CLAIMABLE, _draw_values(queues, names),
            (len(queues), None if names is None else len(names)),
        )
        return bool(rows) and (bool(rows[0][0]) or bool(rows[0][1]))

    def recover_leases(self) -> builtins.list[TaskRecord]:
        """Settle every task whose lease expired; run inside the claim transaction."""
        return self._tasks(_RECOVER, {"lease_error": _LEASE_EXPIRED})

    def claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = 1,
        names: Sequence[str] | None = None,
        draws: Iterable[tuple[Sequence[str] | None, int]] | None = None,
    ) -> builtins.list[TaskRecord]:
        """Recover expired leases, then take up to `limit` due tasks, in one transaction.

        `draws` lets a worker take several per-name quotas in the same
        transaction: each (names, limit) pair is one claim statement.
        """
        if isinstance(queues, str):
            queues = [queues]
        if not queues:
            raise ValueError("claim needs at least one queue.")
        check_integer("lease_ms", lease_ms)
        check_integer("limit", limit, minimum=0)
        plan = [
            (draw_names, draw_limit)
            for draw_names, draw_limit in (list(draws) if draws is not None else [(names, limit)])
            if draw_limit > 0 and (draw_names is None or draw_names)
        ]
        claimed = None
        if self.dialect.has_row_locks and len(plan) == 1:
            claimed = self._claim_one_round_trip(queues, worker_id, lease_ms, *plan[0])
        if claimed is None:
            claimed = self._claim_in_transaction(queues, worker_id, lease_ms, plan)
        claimed.sort(key=lambda t: (-t.priority, t.run_at_ms, t.id))
        return claimed

    def _claim_in_transaction(self, queues, worker_id, lease_ms, plan) -> builtins.list[TaskRecord]:
        claimed: list[TaskRecord] = []
        with self.atomic():
            self.recover_leases()
            for draw_names, draw_limit in plan:  # already free of empty draws
                values = {"worker_id": worker_id, "lease_ms": lease_ms, **_draw_values(queues, draw_names)}
                claimed += self._tasks(_CLAIM, values, _claim_shape(queues, draw_names, draw_limit))
        return claimed

    def _claim_one_round_trip(
        self,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int,
        names: Sequence[str] | None,
        limit: int,
    ) -> builtins.list[TaskRecord] | None:
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
        values = {
            "worker_id": worker_id, "lease_ms": lease_ms, "lease_error": _LEASE_EXPIRED,
            **_draw_values(queues, names),
        }
        shape = _claim_shape(queues, names, limit)
        self._verify_protocol()
        with connection.cursor() as cursor:
            if not isinstance(cursor.cursor, _ClientCursor):
                return None
            if not _CLAIM.compiled(self.using, shape):
                with transaction.atomic(using=self.using):
                    _RECOVER.template(self.using)
                    _CLAIM.template(self.using, shape)
            recover, recover_params = _RECOVER.bind(self.using, values)
            claim, claim_params = _CLAIM.bind(self.using, values, shape)
            cursor.execute(f"{recover}; {claim}", recover_params + claim_params)
            cursor.nextset()
            return [_record(row) for row in cursor.fetchall()]

    def _owned(self, statement: Statement, task_id: str, worker_id: str, values: dict) -> TaskRecord:
        values.update(id=task_id, worker_id=worker_id)
        task = self._task(statement, values)
        if task is None:
            raise LostLease(task_id)
        return task

    def heartbeat(self, task_id: str, worker_id: str, lease_ms: int) -> TaskRecord:
        check_integer("lease_ms", lease_ms)
        return self._owned(_RENEW, task_id, worker_id, {"lease_ms": lease_ms})

    def heartbeat_batch(
        self, task_ids: Sequence[str], worker_id: str, lease_ms: int
    ) -> dict[str, bool]:
        """Renew every lease still held; answer {id: cancel_requested} for those rows."""
        check_integer("lease_ms", lease_ms)
        if not task_ids:
            return {}
        rows = self._run(
            _RENEW_MANY, {"worker_id": worker_id, "lease_ms": lease_ms}, (len(task_ids),),
            [{"id": task_id} for task_id in task_ids],
        )
        held = {task_id: cancel_at is not None for task_id, cancel_at in rows}
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
            _PROGRESS, task_id, worker_id, {"progress": progress, "message": message}
        )

    def succeed(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """running -> succeeded with result (ignores a pending cancel; see complete)."""
        return self._owned(_SUCCEED, task_id, worker_id, {"result": _result_json(result)})

    def complete(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """Finish a run: succeeded with result, or canceled if a cancel is pending."""
        return self._owned(_COMPLETE, task_id, worker_id, {"result": _result_json(result)})

    @staticmethod
    def encode_result(result: Any) -> str | None:
        """The stored form of a handler's result; raises SerializationError before any write."""
        return _result_json(result)

    def complete_encoded_many(
        self, items: Sequence[tuple[str, str, str | None]]
    ) -> builtins.list[TaskRecord | None]:
        """Complete several runs in ONE transaction; None where the lease was no longer held.

        Each item is (task_id, worker_id, result encoded by encode_result).
        Every row keeps complete()'s own ownership check, so one lost lease
        settles nothing else wrongly; the saving is the commit, one per group
        instead of one per task.
        """
        if not items:
            return []
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for task_id, worker_id, result_json in items:
            by_owner.setdefault(worker_id, []).append({"id": task_id, "result": result_json})
        rows: list[TaskRecord] = []
        with self.atomic():
            for worker_id, group in by_owner.items():
                for start in range(0, len(group), _GROUP_ROWS):
                    chunk = group[start : start + _GROUP_ROWS]
                    rows += self._tasks(
                        _COMPLETE_MANY, {"worker_id": worker_id}, (len(chunk),), chunk
                    )
        by_id = {row.id: row for row in rows}
        return [by_id.get(task_id) for task_id, _, _ in items]

    def fail(
        self,
        task_id: str,
        worker_id: str,
        error: Any,
        retryable: bool = True,
        delay_ms: int = 0,
    ) -> TaskRecord:
        """Requeue (retryable, attempts left), fail terminally, or cancel if requested."""
        check_integer("delay_ms", delay_ms, minimum=0)
        if isinstance(error, BaseException):
            error = error_envelope(
                type=type(error).__name__, code="handler_error", message=str(error),
                retryable=retryable,
            )
        elif isinstance(error, str):
            error = error_envelope(
                type="Error", code="handler_error", message=error, retryable=retryable
            )
        return self._owned(
            _FAIL, task_id, worker_id,
            {"error": _error_json(error, retryable), "retryable": bool(retryable), "delay_ms": delay_ms},
        )


# ------------------------------------------------------------- the statements
# The models are imported on first use: the package's __init__ imports the
# store before Django's app registry is ready.
def _models():
    from .. import models

    return models


def _tasks_of(using: str) -> TaskQuerySet:
    return _models().Task.objects.using(using)


def _task_columns(queryset: QuerySet, dialect: Dialect) -> QuerySet:
    """The whole row, every JSON and free-text column raw, for the codec to decode."""
    return queryset.values_list(
        *(RawText(c) if c in RAW_TEXT_COLUMNS or c in JSON_COLUMNS else c for c in COLUMNS)
    )


def _record(row: Sequence[Any]) -> TaskRecord:
    return TaskRecord.from_row(dict(zip(COLUMNS, row, strict=True)))


def _texts(name: str, count: int) -> list:
    return [text_param(f"{name}{i}") for i in range(count)]


def _draw_values(queues: Sequence[str], names: Sequence[str] | None) -> dict[str, Any]:
    values = {f"q{i}": queue for i, queue in enumerate(queues)}
    values.update({f"n{i}": name for i, name in enumerate(names or ())})
    return values


def _claim_shape(queues, names, limit: int) -> tuple:
    return (len(queues), None if names is None else len(names), limit)


def _claimable(using: str, queues: int, names: int | None) -> TaskQuerySet:
    return _tasks_of(using).claimable(
        _texts("q", queues), None if names is None else _texts("n", names)
    )


def _returning_row(queryset: QuerySet, values: dict) -> Template:
    return update_sql(queryset, values, returning_columns(queryset.db))


def _owned_update(transition) -> Statement:
    return Statement(lambda using: _returning_row(
        _tasks_of(using).filter(id=text_param("id")).owned(text_param("worker_id")), transition()
    ))


def _build_insert(using: str, count: int) -> Template:
    fields = ("id", "name", "queue", "status", "payload", "metadata", "max_attempts",
              "priority", "run_at_ms", "parent_id", "root_id", "correlation_id",
              "created_at_ms", "updated_at_ms")
    Task = _models().Task
    rows = [
        Task(
            id=text_param("id", i), name=text_param("name", i), queue=text_param("queue", i),
            status=Value("queued"), payload=JsonParam("payload", i),
            metadata=JsonParam("metadata", i), max_attempts=int_param("max_attempts", i),
            priority=int_param("priority", i), run_at_ms=now_plus(int_param("delay_ms", i)),
            parent_id=text_param("parent_id", i), root_id=text_param("root_id", i),
            correlation_id=text_param("correlation_id", i),
            created_at_ms=NowMs(), updated_at_ms=NowMs(),
        )
        for i in range(count)
    ]
    # The clock comes back so records need not be read back; SQLite's is this process's.
    returning = () if dialect_of(using).uses_process_clock else ("created_at_ms",)
    return insert_sql(Task, fields, rows, using, returning=returning)


def _build_point_key(using: str) -> Template:
    TaskKey = _models().TaskKey
    key = TaskKey(key=text_param("key"), task_id=text_param("task_id"),
                  created_at_ms=NowMs(), updated_at_ms=NowMs())
    return insert_sql(
        TaskKey, ("key", "task_id", "created_at_ms", "updated_at_ms"), [key], using,
        on_conflict=OnConflict.UPDATE, update_fields=("task", "updated_at_ms"),
        unique_fields=("key",),
    )


def _build_purge(using: str, limit: int, queue: bool, status: bool, name: bool) -> Template:
    doomed = (
        _tasks_of(using)
        .purgeable(
            int_param("older_than_ms"),
            queue=text_param("queue") if queue else None,
            status=text_param("status") if status else None,
            name=text_param("name") if name else None,
        )
        .oldest_completed_first()
        .values("id")[:limit]
        .select_for_update(skip_locked=True)
    )
    quote = connections[using].ops.quote_name
    return delete_sql(
        _tasks_of(using).filter(id__in=doomed), f"{quote('id')}, {quote('completed_at_ms')}"
    )


def _build_purge_ids(using: str, count: int) -> Template:
    ids = [text_param("id", i) for i in range(count)]
    return delete_sql(
        _tasks_of(using).filter(one_of("id", ids)).terminal(),
        connections[using].ops.quote_name("id"),
    )


def _build_has_claimable(using: str, queues: int, names: int | None) -> Template:
    probe = (
        _models().ProtocolMeta.objects.using(using)
        .filter(key="protocol_version")
        .annotate(
            work=Exists(_claimable(using, queues, names).order_by()),
            expired=Exists(_tasks_of(using).expired_leases()),
        )
        .values_list("work", "expired")
    )
    return select_sql(probe)


def _build_claim(using: str, queues: int, names: int | None, limit: int) -> Template:
    chosen = (
        _claimable(using, queues, names).values("id")[:limit].select_for_update(skip_locked=True)
    )
    return _returning_row(_tasks_of(using).filter(id__in=chosen), transitions.claim())


def _build_recover(using: str) -> Template:
    expired = _tasks_of(using).expired_leases().values("id").select_for_update(skip_locked=True)
    return _returning_row(_tasks_of(using).filter(id__in=expired), transitions.recover_lease())


def _build_renew_many(using: str, count: int) -> Template:
    ids = [text_param("id", i) for i in range(count)]
    quote = connections[using].ops.quote_name
    return update_sql(
        _tasks_of(using).filter(one_of("id", ids)).owned(text_param("worker_id")),
        transitions.renew(), f"{quote('id')}, {quote('cancel_requested_at_ms')}",
    )


def _build_complete_many(using: str, count: int) -> Template:
    ids = [text_param("id", i) for i in range(count)]
    result = Case(*(When(id=ids[i], then=JsonParam("result", i)) for i in range(count)))
    return _returning_row(
        _tasks_of(using).filter(one_of("id", ids)).owned(text_param("worker_id")),
        transitions.complete(result),
    )


_INSERT = Statement(_build_insert)
_POINT_KEY = Statement(_build_point_key)
_GET = Statement(lambda using: select_sql(
    _task_columns(_tasks_of(using).filter(id=text_param("id")), dialect_of(using))
))
_BY_KEY = Statement(lambda using: select_sql(
    _task_columns(_tasks_of(using).by_key(text_param("key")), dialect_of(using))
))
_STATUS = Statement(lambda using: select_sql(
    _tasks_of(using).filter(id=text_param("id")).values_list("id", "status")
))
_STATUS_BY_KEY = Statement(lambda using: select_sql(
    _tasks_of(using).by_key(text_param("key")).values_list("id", "status")
))
_KEY_TARGET = Statement(lambda using: select_sql(
    _models().TaskKey.objects.using(using).filter(key=text_param("key")).values_list("task_id")
))
_CANCEL = Statement(lambda using: _returning_row(
    _tasks_of(using).filter(id=text_param("id")).live(), transitions.cancel()
))
_RETRY = Statement(lambda using: _returning_row(
    _tasks_of(using).filter(LiteralIn("status", ("failed", "canceled")), id=text_param("id")),
    transitions.retry(),
))
_PURGE = Statement(_build_purge)
_PURGE_IDS = Statement(_build_purge_ids)
_HAS_CLAIMABLE = Statement(_build_has_claimable)
_RECOVER = Statement(_build_recover)
_CLAIM = Statement(_build_claim)
_RENEW = _owned_update(transitions.renew)
_RENEW_MANY = Statement(_build_renew_many)
_PROGRESS = _owned_update(transitions.report_progress)
_SUCCEED = _owned_update(transitions.succeed)
_COMPLETE = _owned_update(transitions.complete)
_COMPLETE_MANY = Statement(_build_complete_many)
_FAIL = _owned_update(transitions.fail)


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
