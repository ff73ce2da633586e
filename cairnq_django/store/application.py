"""What application code, the admin, retention and schedules do: submit, read, control, purge, count.

A submit made inside `transaction.atomic()` commits or rolls back with the
caller's data: statements run on Django's own connection for the alias. Write
sequences run in `transaction.atomic()` too: on SQLite that is BEGIN IMMEDIATE
(the app's system check insists on it), on Postgres a READ COMMITTED
transaction.
"""

from __future__ import annotations

import builtins  # list() shadows `list` in the annotations of the methods after it
import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

from django.db import transaction
from django.db.models import Count

from .. import jsoncodec, signals
from ..conf import cairnq_settings
from ..errors import AlreadyExists
from ..ids import new_task_id, now_ms
from ..models import TaskFlow
from ..records import (
    DEFAULT_CONFLICT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    MAX_LIMIT_VALUE_LENGTH,
    STATUSES,
    TERMINAL_STATUSES,
    TaskRecord,
    TaskSpec,
    TaskStatus,
)
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
from .encoding import inserted_record
from .executor import Executor
from .postgres_engine import GenericEngine, PostgresEngine, engine_of
from .protocol_statements import (
    BY_KEY,
    CANCEL,
    GET,
    INSERT,
    KEY_TARGET,
    POINT_KEY,
    PURGE,
    PURGE_IDS,
    RETRY,
    STATUS,
    STATUS_BY_KEY,
)

# Rows per multi-row INSERT: 14 values each stays under SQLite's 32,766
# parameters, and the statement text repeats, so it is compiled once.
_INSERT_ROWS = 1000


class ApplicationOperations(Executor):
    """Submits, reads, cancels, retries and purges, run on one alias's connection (Executor)."""

    def __init__(
        self, using: str, engine: Callable[[Executor], PostgresEngine | GenericEngine] = engine_of
    ) -> None:
        super().__init__(using)
        # The alias's round-trip variants (postgres_engine.py), chosen once (a
        # test passes a factory to choose either engine anywhere).
        self.engine = engine(self)

    def _written(self, rows: builtins.list[TaskRecord]) -> None:
        # Only `testing`'s inline mode listens; without a receiver, no send.
        if signals.task_written.receivers:
            signals.task_written.send(sender=None, using=self.using, rows=rows)

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
        concurrency_key: str | None = None,
    ) -> TaskSpec:
        """Validate and encode one task for insertion; raises before any write."""
        check_label("Task name", name, MAX_NAME_LENGTH)
        check_label("concurrency_key", concurrency_key, MAX_LIMIT_VALUE_LENGTH, optional=True)
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
            "concurrency_key": concurrency_key,
        }

    def _insert(self, specs: Sequence[TaskSpec]) -> list[TaskRecord]:
        """Insert prepared tasks; build their records from the specs and the insert's clock.

        Only "now" comes back from the database: the rest of each row is what
        was just written, and reading it back would decode every JSON value a
        second time. A large batch may go through the engine's COPY instead
        (postgres_engine.py).
        """
        if not specs:
            return []
        self.verify_protocol()
        copied = self.engine.copy_insert(specs)
        if copied is not None:
            return copied
        now = now_ms() if self.dialect.uses_process_clock else None
        for start in range(0, len(specs), _INSERT_ROWS):
            chunk = specs[start : start + _INSERT_ROWS]
            found = self.run(INSERT, shape=(len(chunk),), rows=chunk, now=now)
            if now is None:
                now = found[0][0]
        # `now` is still None here only when there were no specs.
        return [inserted_record(spec, cast(int, now)) for spec in specs]

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
        self, spec: TaskSpec, *, key: str | None = None, conflict: str = DEFAULT_CONFLICT
    ) -> TaskRecord:
        """Write a task validated by `prepare`.

        An unkeyed task is one INSERT, which commits by itself in autocommit
        mode: a transaction around it would only add BEGIN and COMMIT.

        A keyed one (lock the key, read its task, write up to three rows) runs
        in a transaction, and inside the caller's it runs in the caller's one
        without a savepoint of its own, as Django's multi-statement writes
        (`Model.save()` of a child model, `bulk_create()`) do: a database error
        part-way marks the caller's transaction for rollback, so nothing
        half-written can commit, without the two round trips of SAVEPOINT and
        RELEASE on every keyed enqueue. `AlreadyExists` is decided before
        anything is written, so it leaves the caller's transaction usable.
        A concurrency key is a second row (models.TaskFlow), written in the
        same transaction the same way, so the task never exists without it.
        """
        task = self._write_one(spec, key, conflict)
        self._written([task])
        return task

    def _write_one(self, spec: TaskSpec, key: str | None, conflict: str) -> TaskRecord:
        if key is None and spec.get("concurrency_key") is None:
            return self._insert([spec])[0]
        if key is None:
            with transaction.atomic(using=self.using, savepoint=False):
                task = self._insert([spec])[0]
                self._write_flow([spec])
            return task
        with transaction.atomic(using=self.using, savepoint=False):
            try:
                return self._submit_keyed(spec, key, conflict)
            except AlreadyExists as exc:
                rejected = exc
        raise rejected

    def _submit_keyed(self, spec: TaskSpec, key: str, conflict: str) -> TaskRecord:
        self.lock_key(key)
        current = self.record(BY_KEY, {"key": key})
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
                self.cancel(current.id)
        task = self._insert([spec])[0]
        self._write_flow([spec])
        self._point_key(key, task.id)
        return task

    def _write_flow(self, specs: Sequence[TaskSpec]) -> None:
        """The flow rows of the inserted specs that carry a concurrency key (models.TaskFlow)."""
        rows = [
            TaskFlow(task_id=spec["id"], concurrency_key=spec["concurrency_key"])
            for spec in specs if spec.get("concurrency_key") is not None
        ]
        if rows:
            TaskFlow.objects.using(self.using).bulk_create(rows)

    def _point_key(self, key: str, task_id: str) -> None:
        """Point `key` at `task_id`, creating the key row or moving it (one upsert)."""
        self.run(POINT_KEY, {"key": key, "task_id": task_id})

    def submit_many(
        self,
        specs: Sequence[TaskSpec],
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
        # Unkeyed rows cannot conflict, so, as bulk_create() does, they take no savepoint of their
        # own inside the caller's transaction (two round trips fewer: a workflow's release pays
        # them between its parent's completion and its child's start). A keyed one can raise
        # AlreadyExists, which must leave the caller's transaction usable.
        savepoint = len(plain) < len(keys)
        with transaction.atomic(using=self.using, savepoint=savepoint):
            for start in range(0, len(plain), chunk_size):
                chunk = plain[start : start + chunk_size]
                by_id = {task.id: task for task in self._insert([specs[i] for i in chunk])}
                self._write_flow([specs[i] for i in chunk])
                for i in chunk:
                    results[i] = by_id[specs[i]["id"]]
            for i, (key, conflict) in enumerate(keys):
                if key is not None:
                    results[i] = self._submit_keyed(specs[i], key, conflict)
        written: list[TaskRecord] = results  # type: ignore[assignment]
        self._written(written)
        return written

    # ------------------------------------------------------------------- reads
    def get(self, task_id: str) -> TaskRecord | None:
        return self.record(GET, {"id": task_id})

    def get_by_key(self, key: str) -> TaskRecord | None:
        return self.record(BY_KEY, {"key": key})

    def get_status(self, task_id: str) -> TaskStatus | None:
        rows = self.run(STATUS, {"id": task_id})
        return TaskStatus(id=rows[0][0], status=rows[0][1]) if rows else None

    def get_status_by_key(self, key: str) -> TaskStatus | None:
        rows = self.run(STATUS_BY_KEY, {"key": key})
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
        page = self.tasks().filter(**filters).newest_first()[offset : offset + limit]
        return self.fetch(page)

    def stats(self, queue: str | None = None) -> dict[str, dict[str, int]]:
        self.verify_protocol()
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
        self.verify_protocol()
        queued = self.tasks().filter(queue=queue).queued().order_by()[:max_depth]
        return max(0, max_depth - queued.count())

    # ---------------------------------------------------------------- control
    def cancel(self, task_id: str) -> TaskRecord | None:
        """queued -> canceled; running -> cancel requested. None if neither applies."""
        return self.record(CANCEL, {"id": task_id})

    def retry(self, task_id: str, *, reset_attempt: bool = False) -> TaskRecord | None:
        """failed/canceled -> queued. None if the task is not in one of those states."""
        return self.record(RETRY, {"id": task_id, "reset": bool(reset_attempt)})

    def _by_key(
        self, key: str, action: Callable[[str], TaskRecord | None]
    ) -> TaskRecord | None:
        with self.atomic():
            self.lock_key(key)
            rows = self.run(KEY_TARGET, {"key": key})
            return action(rows[0][0]) if rows else None

    def cancel_by_key(self, key: str) -> TaskRecord | None:
        return self._by_key(key, self.cancel)

    def retry_by_key(self, key: str, *, reset_attempt: bool = False) -> TaskRecord | None:
        return self._by_key(key, lambda task_id: self.retry(task_id, reset_attempt=reset_attempt))

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
        rows = self.run(PURGE, values, shape)
        # RETURNING follows the delete's scan order, not the subselect's ORDER BY.
        rows.sort(key=lambda row: (row[1], row[0]))
        return [row[0] for row in rows]

    def count_purgeable(self, *, older_than_ms: int = 0, queue: str | None = None,
                        status: str | None = None, name: str | None = None) -> int:
        """How many tasks purge() with these arguments would delete, all batches together."""
        self.verify_protocol()
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
            deleted += [row[0] for row in self.run(PURGE_IDS, shape=(len(chunk),), rows=chunk)]
        return deleted


# One per alias, built on first use.
_store_of = functools.cache(ApplicationOperations)


def get_store(using: str | None = None) -> ApplicationOperations:
    """The application part for a database alias (default: settings.CAIRNQ['DATABASE']).

    What application code, the admin, retention, schedules and flow control
    use; a lease holder (the worker, `testing`, conformance) takes
    `store.leases.get_leases(using)`, which can do all of this too.
    """
    return _store_of(cairnq_settings.DATABASE if using is None else using)
