"""What only a lease holder may do: probe for work, claim it, renew the lease, report, settle.

The worker, `testing` and conformance take this part (`get_leases(using)`);
application code takes `get_store(using)` (application.py), and an
import-linter contract keeps this module out of the client, the admin,
retention, schedules, flow control and the Tasks backend. Every write after
the claim checks that the caller still holds the lease (its worker id, and a
lease that has not expired); one that matched nothing raises LostLease.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from django.db.models import F

from ..conf import cairnq_settings
from ..errors import LostLease, error_envelope
from ..jsoncodec import check_text, dumps
from ..models import TaskFlow
from ..records import DEFAULT_LEASE_MS, Limit, TaskRecord
from ..validators import MAX_DELAY_MS, check_integer
from . import attempts, limited_claim
from .application import ApplicationOperations
from .encoding import LEASE_EXPIRED, encode_result, error_json
from .limited_claim import LimitedClaim, relevant_limits
from .protocol_statements import (
    CLAIM,
    COMPLETE,
    COMPLETE_MANY,
    FAIL,
    IDLE_PROBE,
    METADATA,
    PROGRESS,
    RECOVER,
    RENEW,
    RENEW_MANY,
    SNOOZE,
    SUCCEED,
    Draw,
    claim_shape,
    drained_notify_sql,
    draw_values,
)
from .statement_cache import Statement

# Rows per grouped-completion statement: 3 parameters each.
_GROUP_ROWS = 500


def _claim_plan(
    queues: Sequence[str] | str,
    lease_ms: int,
    limit: int,
    names: Sequence[str] | None,
    draws: Iterable[Draw] | None,
) -> tuple[Sequence[str], list[Draw]]:
    """A claim's queues and its draws, checked, without the draws that can take nothing."""
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
    return queues, plan


@dataclass(frozen=True)
class IdleProbe:
    """What an idle worker's probe found: due work (or an expired lease), and the next due time."""

    work: bool
    # Milliseconds until the earliest queued, not yet due task of the names
    # falls due, by the queue's clock; None when there is none.
    due_in_ms: int | None


def claim_order(task: TaskRecord) -> tuple[int, int, str]:
    """The protocol's claim order: highest priority, then earliest run_at, then id."""
    return (-task.priority, task.run_at_ms, task.id)


class LeaseOperations(ApplicationOperations):
    """Claims and settles on one alias's connection; every write checks that the caller holds the lease.

    A lease holder submits and reads too (a handler's children, a settled
    step's release), so this part is the application part and more.
    """

    def probe_idle(self, *, queues: Sequence[str], names: Sequence[str] | None = None) -> IdleProbe:
        """Read-only probe: is there due work (or an expired lease) worth a claim?

        And, in the same statement, when the next queued task falls due.
        `names` None: tasks of every name.
        """
        if names is not None and not names:
            return IdleProbe(work=False, due_in_ms=None)
        rows = self.run(
            IDLE_PROBE, draw_values(queues, names), (len(queues), None if names is None else len(names))
        )
        if not rows:
            return IdleProbe(work=False, due_in_ms=None)
        work, expired, due_in_ms = rows[0]
        return IdleProbe(
            work=bool(work) or bool(expired),
            due_in_ms=None if due_in_ms is None else max(0, int(due_in_ms)),
        )

    def recover_leases(self) -> list[TaskRecord]:
        """Settle every task whose lease expired; run inside the claim transaction.

        Each recovered attempt gets its "lost" row (store/attempts.py) in the
        same transaction: a second statement only when something was recovered.
        """
        recovered = self.records(RECOVER, {"lease_error": LEASE_EXPIRED})
        attempts.record_lost(self.using, recovered)
        return recovered

    def claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = 1,
        names: Sequence[str] | None = None,
        draws: Iterable[Draw] | None = None,
        announce: tuple[str, Sequence[str]] | None = None,
    ) -> list[TaskRecord]:
        """Recover expired leases, then take up to `limit` due tasks, in one transaction.

        `draws` lets a worker take several per-name quotas in the same
        transaction: each (names, limit) pair is one claim statement.
        `announce` = (key, names): where the database has NOTIFY, the same
        transaction tells the fleet when nothing claimable is left for those
        names (drained.py); elsewhere it is ignored.
        """
        queues, plan = _claim_plan(queues, lease_ms, limit, names, draws)
        # PostgreSQL: the recovery and the claim in one round trip, where it can.
        claimed = self.engine.claim(queues, worker_id, lease_ms, plan, announce)
        if claimed is None:
            claimed = []
            with self.atomic():
                self.recover_leases()
                for draw_names, draw_limit in plan:  # already free of empty draws
                    values = {"worker_id": worker_id, "lease_ms": lease_ms, **draw_values(queues, draw_names)}
                    claimed += self.records(CLAIM, values, claim_shape(queues, draw_names, draw_limit))
                if announce is not None and self.dialect.has_listen_notify:
                    self.run_sql(*drained_notify_sql(self.using, queues, *announce))
        claimed.sort(key=claim_order)
        return claimed

    def claim_limited(
        self,
        *,
        limits: Sequence[Limit],
        queues: Sequence[str],
        worker_id: str,
        lease_ms: int = DEFAULT_LEASE_MS,
        limit: int = 1,
        names: Sequence[str] | None = None,
        draws: Iterable[Draw] | None = None,
        announce: tuple[str, Sequence[str]] | None = None,
    ) -> LimitedClaim:
        """claim() under fleet-wide flow limits (store/limited_claim.py); `limits` in force.

        With no limits this is claim() itself. With some, one transaction
        serialized across the fleet takes what the limits allow, in claim
        order, and says what they held back.
        """
        queues, plan = _claim_plan(queues, lease_ms, limit, names, draws)
        # Only the limits this claim's tasks can fall under: a claim that no
        # limit concerns changes no limited count, so it need not queue
        # behind the fleet's limited claims.
        in_force, limits = limits, relevant_limits(limits, queues, plan)
        if not limits:
            return LimitedClaim(self.claim(
                queues=queues, worker_id=worker_id, lease_ms=lease_ms, draws=plan, announce=announce,
            ))
        if not plan:
            return LimitedClaim([])
        result = limited_claim.claim(
            self, self.recover_leases, limits, queues, worker_id, lease_ms, plan, announce, in_force
        )
        result.tasks.sort(key=claim_order)
        return result

    def _owned(
        self, statement: Statement, task_id: str, worker_id: str, values: dict[str, Any]
    ) -> TaskRecord:
        values.update(id=task_id, worker_id=worker_id)
        task = self.record(statement, values)
        if task is None:
            raise LostLease(task_id)
        return task

    def heartbeat(self, task_id: str, worker_id: str, lease_ms: int) -> TaskRecord:
        check_integer("lease_ms", lease_ms)
        return self._owned(RENEW, task_id, worker_id, {"lease_ms": lease_ms})

    def heartbeat_batch(
        self, task_ids: Sequence[str], worker_id: str, lease_ms: int
    ) -> dict[str, bool]:
        """Renew every lease still held; answer {id: cancel_requested} for those rows."""
        check_integer("lease_ms", lease_ms)
        if not task_ids:
            return {}
        rows = self.run(
            RENEW_MANY, {"worker_id": worker_id, "lease_ms": lease_ms}, (len(task_ids),),
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
            PROGRESS, task_id, worker_id, {"progress": progress, "message": message}
        )

    def replace_metadata(
        self, task_id: str, worker_id: str, metadata: dict[str, Any]
    ) -> TaskRecord:
        """Rewrite a running task's metadata; raises LostLease unless the lease is held."""
        if not isinstance(metadata, dict):
            raise ValueError(f"metadata must be a dict, got {type(metadata).__name__}.")
        return self._owned(
            METADATA, task_id, worker_id, {"metadata": dumps(metadata, what="metadata")}
        )

    def succeed(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """running -> succeeded with result (ignores a pending cancel; see complete)."""
        return self._owned(SUCCEED, task_id, worker_id, {"result": encode_result(result)})

    def complete(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        """Finish a run: succeeded with result, or canceled if a cancel is pending."""
        return self._owned(COMPLETE, task_id, worker_id, {"result": encode_result(result)})

    def complete_encoded_many(
        self, items: Sequence[tuple[str, str, str | None]]
    ) -> list[TaskRecord | None]:
        """Complete several runs in ONE transaction; None where the lease was no longer held.

        Each item is (task_id, worker_id, result encoded by encoding.encode_result).
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
                rows += self.records(COMPLETE_MANY, {"worker_id": worker_id}, (len(chunk),), chunk)
        by_id = {row.id: row for row in rows}
        return [by_id.get(task_id) for task_id, _, _ in items]

    def fail(
        self,
        task_id: str,
        worker_id: str,
        error: Any,
        retryable: bool = True,
        delay_ms: int = 0,
        *,
        started_at_ms: int | None = None,
    ) -> TaskRecord:
        """Requeue (retryable, attempts left), fail terminally, or cancel if requested.

        The attempt's row (store/attempts.py; `started_at_ms` is its claim's
        stamp, when the caller has it) is written in the same transaction.
        """
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
        with self.atomic():
            task = self._owned(
                FAIL, task_id, worker_id,
                {"error": error_json(error, retryable), "retryable": bool(retryable), "delay_ms": delay_ms},
            )
            attempts.record_ended(self.using, task, worker_id, started_at_ms)
        return task

    def snooze(
        self, task_id: str, worker_id: str, delay_ms: int, *, started_at_ms: int | None = None
    ) -> TaskRecord:
        """Requeue a run due in delay_ms, giving its attempt back; canceled if a cancel is pending.

        Ownership-checked as complete and fail are. No error is written. The
        task's snooze count (models.TaskFlow) goes up in the same
        transaction; a snooze that ended in a cancel is not counted.
        """
        check_integer("delay_ms", delay_ms)
        if delay_ms > MAX_DELAY_MS:
            raise ValueError(f"delay_ms must be at most {MAX_DELAY_MS}, got {delay_ms!r}.")
        with self.atomic():
            task = self._owned(SNOOZE, task_id, worker_id, {"delay_ms": delay_ms})
            if task.status == "queued":
                # The task row is locked (or, on SQLite, the database) until
                # commit, so no other write can race the first row's insert.
                flow = TaskFlow.objects.using(self.using)
                if not flow.filter(task_id=task_id).update(snoozes=F("snoozes") + 1):
                    flow.create(task_id=task_id, snoozes=1)
            attempts.record_ended(self.using, task, worker_id, started_at_ms, snooze=True)
        return task


# One per alias, built on first use.
_leases_of = functools.cache(LeaseOperations)


def get_leases(using: str | None = None) -> LeaseOperations:
    """The lease part for a database alias (default: settings.CAIRNQ['DATABASE']).

    One per alias, as `get_store`.
    """
    return _leases_of(cairnq_settings.DATABASE if using is None else using)
