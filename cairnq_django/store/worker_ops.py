"""The worker's side of the protocol: probe, claim, renew, report progress, settle."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

from django.db import connections, transaction
from django.db.models import F

from ..errors import LostLease, error_envelope
from ..jsoncodec import check_text
from ..records import DEFAULT_LEASE_MS, TaskRecord
from ..validators import MAX_DELAY_MS, check_integer
from . import queries as q
from .encoding import LEASE_EXPIRED, error_json, record, result_json
from .plumbing import StoreBase
from .statements import Statement


def drained_notify_sql(
    using: str, queues: Sequence[str], key: str, names: Sequence[str]
) -> tuple[str, list[Any]]:
    """SELECT pg_notify(drained channel, key) if nothing is claimable for `names` (wakeup/drained.py)."""
    from ..wakeup.drained import DRAINED_CHANNEL

    shape = (len(queues), len(names))
    probe, probe_params = q.HAS_CLAIMABLE.bind(using, q.draw_values(queues, names), shape)
    # The probe is a compiled statement; every value in it is a bound parameter.
    sql = (
        f"SELECT pg_notify(%s, %s) FROM ({probe}) AS cairnq_probe (work, expired)"  # noqa: S608
        " WHERE NOT cairnq_probe.work"
    )
    return sql, [DRAINED_CHANNEL, key, *probe_params]


def _is_client_cursor(cursor: Any) -> bool:
    """Is `cursor` psycopg 3's client-side-binding cursor?

    Looked up in sys.modules rather than imported: a cursor can only be one
    once psycopg is loaded, and importing it here cost a SQLite worker about
    a sixth of its start-up (psycopg and libpq, ~50 ms under -X importtime).
    """
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(cursor, psycopg.ClientCursor)


# Rows per grouped-completion statement: 3 parameters each.
_GROUP_ROWS = 500


class WorkerOperations(StoreBase):
    """Claims and settles; every write checks that the caller still holds the lease."""

    def has_claimable(self, *, queues: Sequence[str], names: Sequence[str] | None = None) -> bool:
        """Read-only probe: is there due work (or an expired lease) worth a claim?"""
        if names is not None and not names:
            return False
        rows = self._run(
            q.HAS_CLAIMABLE, q.draw_values(queues, names),
            (len(queues), None if names is None else len(names)),
        )
        return bool(rows) and (bool(rows[0][0]) or bool(rows[0][1]))

    def recover_leases(self) -> list[TaskRecord]:
        """Settle every task whose lease expired; run inside the claim transaction."""
        return self._tasks(q.RECOVER, {"lease_error": LEASE_EXPIRED})

    def claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = 1,
        names: Sequence[str] | None = None,
        draws: Iterable[tuple[Sequence[str] | None, int]] | None = None,
        announce: tuple[str, Sequence[str]] | None = None,
    ) -> list[TaskRecord]:
        """Recover expired leases, then take up to `limit` due tasks, in one transaction.

        `draws` lets a worker take several per-name quotas in the same
        transaction: each (names, limit) pair is one claim statement.
        `announce` = (key, names): where the database has NOTIFY, the same
        transaction tells the fleet when nothing claimable is left for those
        names (wakeup/drained.py); elsewhere it is ignored.
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
        if not self.dialect.has_listen_notify:
            announce = None
        claimed = None
        if self.dialect.has_row_locks and len(plan) == 1:
            claimed = self._claim_one_round_trip(queues, worker_id, lease_ms, *plan[0], announce)
        if claimed is None:
            claimed = self._claim_in_transaction(queues, worker_id, lease_ms, plan, announce)
        claimed.sort(key=lambda t: (-t.priority, t.run_at_ms, t.id))
        return claimed

    def _claim_in_transaction(self, queues, worker_id, lease_ms, plan, announce=None) -> list[TaskRecord]:
        claimed: list[TaskRecord] = []
        with self.atomic():
            self.recover_leases()
            for draw_names, draw_limit in plan:  # already free of empty draws
                values = {"worker_id": worker_id, "lease_ms": lease_ms, **q.draw_values(queues, draw_names)}
                claimed += self._tasks(q.CLAIM, values, q.claim_shape(queues, draw_names, draw_limit))
            if announce is not None:
                sql, params = drained_notify_sql(self.using, queues, *announce)
                with connections[self.using].cursor() as cursor:
                    cursor.execute(sql, params)
        return claimed

    def _claim_one_round_trip(
        self,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int,
        names: Sequence[str] | None,
        limit: int,
        announce: tuple[str, Sequence[str]] | None = None,
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
        values = {
            "worker_id": worker_id, "lease_ms": lease_ms, "lease_error": LEASE_EXPIRED,
            **q.draw_values(queues, names),
        }
        shape = q.claim_shape(queues, names, limit)
        self._verify_protocol()
        with connection.cursor() as cursor:
            if not _is_client_cursor(cursor.cursor):
                return None
            if not q.CLAIM.compiled(self.using, shape):
                with transaction.atomic(using=self.using):
                    q.RECOVER.template(self.using)
                    q.CLAIM.template(self.using, shape)
            recover, recover_params = q.RECOVER.bind(self.using, values)
            claim, claim_params = q.CLAIM.bind(self.using, values, shape)
            sql, params = f"{recover}; {claim}", recover_params + claim_params
            if announce is not None:
                # A third statement of the same transaction, seeing the claim's changes.
                notify, notify_params = drained_notify_sql(self.using, queues, *announce)
                sql, params = f"{sql}; {notify}", params + notify_params
            cursor.execute(sql, params)
            cursor.nextset()
            return [record(row) for row in cursor.fetchall()]

    def _owned(self, statement: Statement, task_id: str, worker_id: str, values: dict) -> TaskRecord:
        values.update(id=task_id, worker_id=worker_id)
        task = self._task(statement, values)
        if task is None:
            raise LostLease(task_id)
        return task

    def heartbeat(self, task_id: str, worker_id: str, lease_ms: int) -> TaskRecord:
        check_integer("lease_ms", lease_ms)
        return self._owned(q.RENEW, task_id, worker_id, {"lease_ms": lease_ms})

    def heartbeat_batch(
        self, task_ids: Sequence[str], worker_id: str, lease_ms: int
    ) -> dict[str, bool]:
        """Renew every lease still held; answer {id: cancel_requested} for those rows."""
        check_integer("lease_ms", lease_ms)
        if not task_ids:
            return {}
        rows = self._run(
            q.RENEW_MANY, {"worker_id": worker_id, "lease_ms": lease_ms}, (len(task_ids),),
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
            q.PROGRESS, task_id, worker_id, {"progress": progress, "message": message}
        )

    def succeed(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """running -> succeeded with result (ignores a pending cancel; see complete)."""
        return self._owned(q.SUCCEED, task_id, worker_id, {"result": result_json(result)})

    def complete(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """Finish a run: succeeded with result, or canceled if a cancel is pending."""
        return self._owned(q.COMPLETE, task_id, worker_id, {"result": result_json(result)})

    @staticmethod
    def encode_result(result: Any) -> str | None:
        """The stored form of a handler's result; raises SerializationError before any write."""
        return result_json(result)

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
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for task_id, worker_id, encoded in items:
            by_owner.setdefault(worker_id, []).append({"id": task_id, "result": encoded})
        updates = [
            (worker_id, group[start : start + _GROUP_ROWS])
            for worker_id, group in by_owner.items()
            for start in range(0, len(group), _GROUP_ROWS)
        ]
        rows: list[TaskRecord] = []
        # One statement (the usual case: one worker's group) commits on its
        # own: a transaction around it would add BEGIN and COMMIT round trips.
        with self.atomic() if len(updates) > 1 else nullcontext():
            for worker_id, chunk in updates:
                rows += self._tasks(q.COMPLETE_MANY, {"worker_id": worker_id}, (len(chunk),), chunk)
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
            q.FAIL, task_id, worker_id,
            {"error": error_json(error, retryable), "retryable": bool(retryable), "delay_ms": delay_ms},
        )

    def snooze(self, task_id: str, worker_id: str, delay_ms: int) -> TaskRecord:
        """Requeue a run due in delay_ms, giving its attempt back; canceled if a cancel is pending.

        Ownership-checked as complete and fail are. No error is written. The
        task's snooze count (flow.models.TaskFlow) goes up in the same
        transaction; a snooze that ended in a cancel is not counted.
        """
        from ..flow.models import TaskFlow  # the app registry is not ready when this module loads

        check_integer("delay_ms", delay_ms)
        if delay_ms > MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be at most {MAX_DELAY_MS}, got {delay_ms!r}.")
        with self.atomic():
            task = self._owned(q.SNOOZE, task_id, worker_id, {"delay_ms": delay_ms})
            if task.status == "queued":
                # The task row is locked (or, on SQLite, the database) until
                # commit, so no other write can race the first row's insert.
                flow = TaskFlow.objects.using(self.using)
                if not flow.filter(task_id=task_id).update(snoozes=F("snoozes") + 1):
                    flow.create(task_id=task_id, snoozes=1)
        return task


# ------------------------------------------------------------- the statements
