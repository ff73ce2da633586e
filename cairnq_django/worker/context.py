"""TaskContext: what a handler holds to report on, settle and extend its task.

Every write through a context is ownership-checked by the store and also
gated locally by the attempt's Settlement (settlement.py), which the worker
settles through as well: once the lease is flagged lost (a heartbeat found
the task taken over, or the attempt was abandoned for running too long or for
shutdown), the context refuses further writes.

Methods are synchronous (Django's ORM is); async handlers use the `a`-prefixed
twins, which run the same code on a database thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from .. import declared, signals, validators
from ..delays import snooze_delay_ms
from ..flow.backpressure import wait_for_headroom
from ..records import TaskRecord
from ..store.leases import LeaseOperations
from .envelopes import as_envelope
from .settlement import Settlement

_T = TypeVar("_T")

# How long canceled() trusts its last read of the row; keeps a tight
# `while not ctx.canceled()` loop from turning into a query storm.
_CANCEL_READ_INTERVAL_S = 0.2


async def run_on_db(db_executor: Any, fn: Callable[[], _T]) -> _T:
    """Run `fn` on one of the worker's database threads; old connections are closed after, as per request."""

    def call() -> _T:
        try:
            return fn()
        finally:
            close_old_connections()

    return await asyncio.get_running_loop().run_in_executor(db_executor, call)


@dataclass(slots=True, eq=False)
class AtomicCompletion:
    """Yielded by `ctx.atomic()`: set `.result` to store it with the completion."""

    result: Any


class TaskContext:
    """One claimed task, as its handler sees it."""

    def __init__(
        self,
        *,
        store: LeaseOperations,
        task: TaskRecord,
        worker_id: str,
        lease_ms: int,
        retry_backoff_base_ms: int = 1_000,
        retry_backoff_cap_ms: int = 30_000,
        db_executor: Any = None,
        retries: bool = True,
    ) -> None:
        self._store = store
        self._task = task
        self._worker_id = worker_id
        self._lease_ms = lease_ms
        self._db_executor = db_executor
        self._cancel_read_at = 0.0
        #: This attempt's ownership and settle state: the worker settles through it.
        self.settlement = Settlement(
            store=store, task=task, worker_id=worker_id, lease_ms=lease_ms,
            backoff=(retry_backoff_base_ms, retry_backoff_cap_ms), retries=retries,
        )

    def __repr__(self) -> str:
        return f"<TaskContext {self.name} {self.task_id} attempt={self.attempt}>"

    # ------------------------------------------------------------ task fields
    @property
    def task_id(self) -> str:
        return self._task.id

    @property
    def name(self) -> str:
        return self._task.name

    @property
    def queue(self) -> str:
        return self._task.queue

    @property
    def attempt(self) -> int:
        return self._task.attempt

    @property
    def max_attempts(self) -> int:
        return self._task.max_attempts

    @property
    def payload(self) -> Any:
        return self._task.payload

    @property
    def metadata(self) -> dict[str, Any]:
        # The protocol's metadata is always a JSON object.
        return cast(dict[str, Any], self._task.metadata)

    @property
    def root_id(self) -> str | None:
        return self._task.root_id

    @property
    def parent_id(self) -> str | None:
        return self._task.parent_id

    @property
    def correlation_id(self) -> str | None:
        return self._task.correlation_id

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def record(self) -> TaskRecord:
        """The row as it was claimed."""
        return self._task

    # ------------------------------------------------------------ lease state
    @property
    def lost_lease(self) -> bool:
        """True once this attempt no longer owns the task; stop doing side effects."""
        return self.settlement.lost_lease

    def wait_lost_lease(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost (or timeout); return whether it was."""
        return self.settlement.wait_lost_lease(timeout)

    # ------------------------------------------------------------ reporting
    def progress(self, value: float | None, message: str | None = None) -> TaskRecord:
        """Record progress (0..1) and/or a status message; None leaves a field as is."""
        return self.settlement.owned(
            lambda: self._store.progress(self.task_id, self._worker_id, value, message)
        )

    def replace_metadata(self, metadata: dict[str, Any]) -> TaskRecord:
        """Rewrite the task's metadata while this attempt holds the lease.

        `record` and `metadata` stay the row as claimed.
        """
        return self.settlement.owned(
            lambda: self._store.replace_metadata(self.task_id, self._worker_id, metadata)
        )

    def heartbeat(self) -> TaskRecord:
        """Renew the lease now (the worker already does this every lease/3)."""
        row = self.settlement.owned(
            lambda: self._store.heartbeat(self.task_id, self._worker_id, self._lease_ms)
        )
        self.settlement.lease_renewed_at = time.monotonic()
        return row

    def canceled(self) -> bool:
        """Return True if someone asked for this task to be canceled (or it is gone)."""
        settlement = self.settlement
        if settlement.cancel_seen:
            return True
        now = time.monotonic()
        if now - self._cancel_read_at < _CANCEL_READ_INTERVAL_S:
            return False
        self._cancel_read_at = now
        row = self._store.get(self.task_id)
        settlement.observe_cancel(row is None or row.cancel_requested or row.status == "canceled")
        return settlement.cancel_seen

    # ------------------------------------------------------------ settling
    def succeed(self, result: Any = None) -> TaskRecord | None:
        """Finish the task now with `result` (canceled instead if a cancel is pending).

        Settling twice is a no-op that returns None.
        """
        return self.settlement.succeed(result)

    def fail(
        self, error: Any = "The task failed.", *, retryable: bool = True
    ) -> TaskRecord | None:
        """Fail the task now: retried with backoff while attempts remain, if retryable.

        `error` is a reason string, an exception, a TaskError (its own
        retryability wins) or an envelope dict. Settling twice is a no-op.
        """
        envelope, retryable = as_envelope(error, retryable)
        return self.settlement.fail(envelope, retryable)

    def snooze(self, delay: float | timedelta) -> TaskRecord | None:
        """Put the task back in the queue for `delay` seconds (or a timedelta): "not now".

        Not a failure: the attempt is given back (snoozes never use up
        max_attempts) and no error is recorded; the task's snooze count goes
        up. Canceled instead if a cancel is pending. A delay that is not a
        positive, finite number of seconds raises ValueError before any
        write. Settling twice is a no-op that returns None. Raising
        `Snooze(delay)` from the handler does the same.
        """
        return self.settlement.snooze(snooze_delay_ms(delay))

    @contextmanager
    def atomic(self, result: Any = None) -> Iterator[AtomicCompletion]:
        """Run the block's writes and this task's completion in ONE transaction.

            with ctx.atomic() as done:
                Invoice.objects.create(...)
                done.result = {"invoice": invoice.pk}

        If the lease is gone when the block ends, LostLease is raised inside
        the transaction, so the block's writes roll back with it.
        """
        completion = AtomicCompletion(result)
        with self.settlement.atomic(lambda: completion.result):
            yield completion

    # ------------------------------------------------------------ children
    def submit(self, name: str, payload: Any = None, **options: Any) -> TaskRecord:
        """Submit a child task (parent_id, root_id and correlation_id are filled in).

        Takes enqueue()'s options (queue, key, conflict, priority, max_attempts,
        metadata, delay, run_at). Inside `ctx.atomic()` the child commits with
        this task's completion.

        Refused once the lease is lost: the attempt is being redone elsewhere,
        and that retry will submit its own children.
        """
        self.settlement.require_lease()
        options.setdefault("correlation_id", self.correlation_id)
        # Options not given take what the child's handler declares (declared.py).
        resolved = declared.row_options(
            name, queue=options.get("queue"), max_attempts=options.get("max_attempts"),
            priority=options.get("priority"),
        )
        options.update(
            queue=resolved.queue, max_attempts=resolved.max_attempts, priority=resolved.priority
        )
        if "delay" in options or "run_at" in options:
            options["delay_ms"] = validators.delay_ms(
                options.pop("delay", None), options.pop("run_at", None), timezone.now()
            )
        key = options.pop("key", None)
        conflict = options.pop("conflict", "reuse")
        options["metadata"], announced = signals.enqueuing(
            name, options["queue"], options.get("metadata"), parent=self.record
        )
        try:
            wait_for_headroom(self._store, options["queue"])
            child = self._store.submit(
                name, payload, key=key, conflict=conflict,
                parent_id=self.task_id, root_id=self.root_id or self.task_id, **options,
            )
        except BaseException as exc:
            if announced:
                signals.enqueued(options["metadata"], error=exc)
            raise
        if announced:
            signals.enqueued(options["metadata"], task=child)
        return child

    # ------------------------------------------------------------ async twins
    async def run_db(self, fn: Callable[[], _T]) -> _T:
        """Run `fn`, database work of an async handler, off the event loop; the twins below use it.

        In a worker, on its database threads; in cairnq_django.testing, which
        has no such threads, on the thread that runs the test, so the work
        shares the test's connection (and sees the rows of its transaction).
        """
        if self._db_executor is None:
            return await sync_to_async(fn, thread_sensitive=True)()
        return await run_on_db(self._db_executor, fn)

    async def aprogress(self, value: float | None, message: str | None = None) -> TaskRecord:
        return await self.run_db(partial(self.progress, value, message))

    async def aheartbeat(self) -> TaskRecord:
        return await self.run_db(self.heartbeat)

    async def acanceled(self) -> bool:
        if self.settlement.cancel_seen:
            return True
        return await self.run_db(self.canceled)

    async def asucceed(self, result: Any = None) -> TaskRecord | None:
        return await self.run_db(partial(self.succeed, result))

    async def afail(
        self, error: Any = "The task failed.", *, retryable: bool = True
    ) -> TaskRecord | None:
        return await self.run_db(partial(self.fail, error, retryable=retryable))

    async def asnooze(self, delay: float | timedelta) -> TaskRecord | None:
        return await self.run_db(partial(self.snooze, delay))

    async def asubmit(self, name: str, payload: Any = None, **options: Any) -> TaskRecord:
        return await self.run_db(partial(self.submit, name, payload, **options))
