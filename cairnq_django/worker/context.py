"""TaskContext: what a handler holds to report on, settle and extend its task.

Every write through a context is ownership-checked by the store and also
gated locally: once the worker flags the lease as lost (a heartbeat found the
task taken over, or the attempt was abandoned for running too long or for
shutdown), the context refuses further writes. The local gate matters because
an abandoned attempt's task may be claimed again by this same worker id, and a
zombie handler's write would then pass the store's ownership check.

Methods are synchronous (Django's ORM is); async handlers use the `a`-prefixed
twins, which run the same code on a database thread.

One module, as the handler's API, the settle API and the ownership gate share one lock and one flag.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections, transaction
from django.db.utils import InterfaceError, OperationalError
from django.utils import timezone

from .. import declared, signals, validators
from ..delays import snooze_delay_ms
from ..errors import LostLease, SerializationError
from ..flow.backpressure import wait_for_headroom
from ..records import TaskRecord
from ..store.leases import LeaseOperations
from .backoff import retry_delay_ms
from .envelopes import as_envelope, unserializable_envelope

# How long canceled() trusts its last read of the row; keeps a tight
# `while not ctx.canceled()` loop from turning into a query storm.
_CANCEL_READ_INTERVAL_S = 0.2


class AtomicCompletion:
    """Yielded by `ctx.atomic()`: set `.result` to store it with the completion."""

    __slots__ = ("result",)

    def __init__(self, result: Any) -> None:
        self.result = result


class _OwnershipLock:
    """The context's lock: an RLock that also waits out a completion being written elsewhere.

    A completion the worker hands to its settler thread (`begin_completion`)
    is written after the handler thread has let go of the lock, so whoever
    takes the lock meanwhile (an abandon at shutdown, a thread the handler
    left behind) first waits for that write's outcome, exactly as it would
    have waited for the handler thread holding the lock through the write.
    """

    __slots__ = ("_rlock", "pending")

    def __init__(self) -> None:
        self._rlock = threading.RLock()
        #: Held while a completion is being written on another thread.
        self.pending: threading.Lock | None = None

    def __enter__(self) -> None:
        self._rlock.acquire()
        pending = self.pending
        if pending is not None:
            pending.acquire()
            pending.release()

    def __exit__(self, *exc: object) -> None:
        self._rlock.release()


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
        self._backoff = (retry_backoff_base_ms, retry_backoff_cap_ms)
        self._db_executor = db_executor
        # False (cairnq_django.testing's default): every failure is final.
        self._retries = retries
        # Serializes "may I still write?" with the write itself, so the worker
        # abandoning an attempt and the handler settling it cannot interleave.
        self._lock = _OwnershipLock()
        # The lost-lease flag; an Event only once someone waits on it, as
        # most attempts never lose their lease and nobody waits.
        self._lost = False
        self._lost_event: threading.Event | None = None
        # Guards `settled` and `_settling` only, and is never held across a
        # database call: the heartbeat asks it whether a task missing from its
        # answer is being settled here, and must not wait behind a write.
        self._state_lock = threading.Lock()
        self._settling = False
        self._cancel_seen = False
        self._cancel_read_at = 0.0
        self.settled = False
        #: The row as the settling write left it (None until settled here).
        self.final: TaskRecord | None = None
        #: (envelope, retryable, delay_ms) of the fail that settled it, if any.
        self.failure: tuple[dict[str, Any], bool, int] | None = None
        #: The delay (ms) of the snooze that settled it, if one did.
        self.snoozed_ms: int | None = None
        #: Set once the worker logged this attempt's end and sent its signal.
        self.ended = False
        # When (monotonic) the last claim or renewal of the lease answered:
        # the server set its expiry no later than that, so the lease has
        # certainly expired one lease after it (see lease_expired_by).
        self.lease_renewed_at = time.monotonic()

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
        return self._task.metadata

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
        return self._lost

    def wait_lost_lease(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost (or timeout); return whether it was."""
        with self._state_lock:
            if self._lost:
                return True
            if self._lost_event is None:
                self._lost_event = threading.Event()
            event = self._lost_event
        return event.wait(timeout)

    def mark_lost_lease(self) -> None:
        with self._state_lock:
            self._set_lost()

    def _set_lost(self) -> None:
        """Raise the lost-lease flag and wake its waiters; the caller holds `_state_lock`."""
        self._lost = True
        if self._lost_event is not None:
            self._lost_event.set()

    def settled_or_settling(self) -> bool:
        """True once a settling write of this attempt has started (or finished).

        A task whose settling write committed is no longer `running`, so a
        heartbeat renewing it finds it gone; that is not a lost lease. The
        flag is raised before the write is sent and dropped only if the write
        fails, so whoever sees the row gone because of that write sees this.
        """
        with self._state_lock:
            return self.settled or self._settling

    def mark_lost_unless_settling(self) -> bool:
        """Flag the lease lost unless a settle is under way; return whether flagged."""
        with self._state_lock:
            if self.settled or self._settling:
                return False
            self._set_lost()
            return True

    def _begin_settling(self) -> None:
        with self._state_lock:
            self._settling = True

    def _abort_settling(self) -> None:
        with self._state_lock:
            self._settling = False

    def observe_cancel(self, cancel_requested: bool) -> None:
        if cancel_requested:
            self._cancel_seen = True

    def _require_lease(self) -> None:
        if self._lost:
            raise LostLease(self.task_id)

    def _owned(self, write: Callable[[], TaskRecord], *, settling: bool = False) -> TaskRecord:
        """Run an ownership-checked write; `settling` marks one that ends the attempt.

        A settling write leaves the attempt settling until `_settle` records
        its row (the caller's job, under `_lock`), or until it raises.
        """
        with self._lock:
            self._require_lease()
            if self.settled:
                # Already finished through this context: the row is terminal,
                # and reporting that as a lost lease would be misleading.
                raise LostLease(self.task_id)
            if settling:
                self._begin_settling()
            try:
                row = write()
            except LostLease:
                self.mark_lost_lease()
                if settling:
                    self._abort_settling()
                raise
            except BaseException:
                if settling:
                    self._abort_settling()
                raise
            self.observe_cancel(row.cancel_requested)
            return row

    def _owned_settle(self, write: Callable[[], TaskRecord]) -> TaskRecord:
        """`_owned` for a write that ends the attempt (completion or failure)."""
        return self._owned(write, settling=True)

    # ------------------------------------------------------------ reporting
    def progress(self, value: float | None, message: str | None = None) -> TaskRecord:
        """Record progress (0..1) and/or a status message; None leaves a field as is."""
        return self._owned(
            lambda: self._store.progress(self.task_id, self._worker_id, value, message)
        )

    def replace_metadata(self, metadata: dict[str, Any]) -> TaskRecord:
        """Rewrite the task's metadata while this attempt holds the lease.

        `record` and `metadata` stay the row as claimed.
        """
        return self._owned(
            lambda: self._store.replace_metadata(self.task_id, self._worker_id, metadata)
        )

    def heartbeat(self) -> TaskRecord:
        """Renew the lease now (the worker already does this every lease/3)."""
        row = self._owned(
            lambda: self._store.heartbeat(self.task_id, self._worker_id, self._lease_ms)
        )
        self.lease_renewed_at = time.monotonic()
        return row

    def lease_expired_by(self) -> float:
        """The monotonic time by which this attempt's lease has certainly expired, unless renewed."""
        return self.lease_renewed_at + self._lease_ms / 1000

    def canceled(self) -> bool:
        """Return True if someone asked for this task to be canceled (or it is gone)."""
        if self._cancel_seen:
            return True
        now = time.monotonic()
        if now - self._cancel_read_at < _CANCEL_READ_INTERVAL_S:
            return False
        self._cancel_read_at = now
        row = self._store.get(self.task_id)
        if row is None or row.cancel_requested or row.status == "canceled":
            self._cancel_seen = True
        return self._cancel_seen

    # ------------------------------------------------------------ settling
    def succeed(self, result: Any = None) -> TaskRecord | None:
        """Finish the task now with `result` (canceled instead if a cancel is pending).

        Settling twice is a no-op that returns None.
        """
        with self._lock:
            if self.settled:
                return None
            row = self._owned_settle(
                lambda: self._store.complete(self.task_id, self._worker_id, result)
            )
            self._settle(row)
            return row

    def fail(
        self, error: Any = "The task failed.", *, retryable: bool = True
    ) -> TaskRecord | None:
        """Fail the task now: retried with backoff while attempts remain, if retryable.

        `error` is a reason string, an exception, a TaskError (its own
        retryability wins) or an envelope dict. Settling twice is a no-op.
        """
        envelope, retryable = as_envelope(error, retryable)
        with self._lock:
            if self.settled:
                return None
            return self._fail_owned(envelope, retryable)

    def fail_unserializable(self, exc: SerializationError) -> TaskRecord:
        """Fail the task for good: its result cannot be stored as JSON, and no retry changes that."""
        with self._lock:
            return self._fail_owned(unserializable_envelope(exc), False)

    def _fail_owned(self, envelope: dict[str, Any], retryable: bool) -> TaskRecord:
        retryable = retryable and self._retries
        delay = self.retry_delay_ms() if retryable else 0
        row = self._owned_settle(
            lambda: self._store.fail(
                self.task_id, self._worker_id, envelope, retryable=retryable, delay_ms=delay,
                started_at_ms=self._task.updated_at_ms,  # the claim's stamp: the attempt's start
            )
        )
        self.failure = (envelope, retryable, delay)
        self._settle(row)
        return row

    def snooze(self, delay: float | timedelta) -> TaskRecord | None:
        """Put the task back in the queue for `delay` seconds (or a timedelta): "not now".

        Not a failure: the attempt is given back (snoozes never use up
        max_attempts) and no error is recorded; the task's snooze count goes
        up. Canceled instead if a cancel is pending. A delay that is not a
        positive, finite number of seconds raises ValueError before any
        write. Settling twice is a no-op that returns None. Raising
        `Snooze(delay)` from the handler does the same.
        """
        delay_ms = snooze_delay_ms(delay)
        with self._lock:
            if self.settled:
                return None
            return self._snooze_owned(delay_ms)

    def _snooze_owned(self, delay_ms: int) -> TaskRecord:
        row = self._owned_settle(
            lambda: self._store.snooze(
                self.task_id, self._worker_id, delay_ms, started_at_ms=self._task.updated_at_ms
            )
        )
        self.snoozed_ms = delay_ms
        self._settle(row)
        return row

    def retry_delay_ms(self) -> int:
        base, cap = self._backoff
        return retry_delay_ms(self.attempt, base_ms=base, cap_ms=cap)

    def _settle(self, row: TaskRecord) -> None:
        self.final = row
        with self._state_lock:
            self.settled = True
            self._settling = False

    # ------------------------------------------------------------ settling by the worker
    # The worker settles what a call left unsettled through these. Each does
    # nothing (and returns None) once the attempt is settled or its lease is
    # lost, and each write is worth one reconnect: the handler's work is done,
    # and losing its settle to a connection the server dropped would run it again.

    def complete_unsettled(self, write: Callable[[], TaskRecord]) -> TaskRecord | None:
        """Complete the task through `write` (the worker's group commit, say).

        A result that cannot be stored as JSON fails the task permanently instead.
        """
        with self._lock:
            if self.settled or self.lost_lease:
                return None
            try:
                row = self._once_more(lambda: self._owned_settle(write))
            except SerializationError as exc:
                return self.fail_unserializable(exc)
            self._settle(row)
            return row

    def begin_completion(self) -> bool:
        """Start a completion that another thread writes; False if there is nothing to complete.

        The attempt is settling from here, as during `complete_unsettled`'s
        write, and the lock's next holder waits until `end_completion`
        reports the write's outcome.
        """
        with self._lock:
            if self.settled or self.lost_lease:
                return False
            pending = threading.Lock()
            pending.acquire()
            self._begin_settling()
            self._lock.pending = pending
            return True

    def end_completion(self, row: TaskRecord | None, *, lost: bool = False) -> None:
        """The outcome of the write `begin_completion` started: the row, lost, or neither (it failed)."""
        if row is not None:
            self.observe_cancel(row.cancel_requested)
            self.final = row
        with self._state_lock:
            if row is not None:
                self.settled = True
            elif lost:
                self._set_lost()
            self._settling = False
            pending, self._lock.pending = self._lock.pending, None
        if pending is not None:
            pending.release()

    def fail_unsettled(self, envelope: dict[str, Any], retryable: bool) -> TaskRecord | None:
        """Fail the task with `envelope`, with backoff while attempts remain if retryable."""
        with self._lock:
            if self.settled or self.lost_lease:
                return None
            return self._once_more(lambda: self._fail_owned(envelope, retryable))

    def snooze_unsettled(self, delay_ms: int) -> TaskRecord | None:
        """Snooze the task for delay_ms (the handler raised Snooze)."""
        with self._lock:
            if self.settled or self.lost_lease:
                return None
            return self._once_more(lambda: self._snooze_owned(delay_ms))

    def abandon(self, envelope: dict[str, Any], *, delay_ms: int | None) -> TaskRecord | None:
        """Take the task from its handler: flag the lease lost, then fail it retryably.

        The handler can write nothing from here on. `delay_ms=None` applies the
        usual backoff. Raises LostLease if the task is no longer this worker's.
        """
        with self._lock:
            settled_or_lost = self.settled or self.lost_lease
            self.mark_lost_lease()
            if settled_or_lost:
                return None
            delay = self.retry_delay_ms() if delay_ms is None else delay_ms
            row = self._once_more(
                lambda: self._store.fail(
                    self.task_id, self._worker_id, envelope, retryable=True, delay_ms=delay,
                    started_at_ms=self._task.updated_at_ms,
                )
            )
            self.failure = (envelope, True, delay)
            self._settle(row)
            return row

    def mark_ended(self) -> bool:
        """Whether the attempt's end is decided and not yet reported; True only once."""
        with self._lock:
            if self.ended or (not self.settled and not self.lost_lease):
                # Reported already, or undecided (a failed write that lease
                # recovery will settle): nothing to say now.
                return False
            self.ended = True
            return True

    def _once_more(self, write: Callable[[], TaskRecord]) -> TaskRecord:
        try:
            return write()
        except (OperationalError, InterfaceError):
            connections[self._store.using].close()
            return write()

    @contextmanager
    def atomic(self, result: Any = None) -> Iterator[AtomicCompletion]:
        """Run the block's writes and this task's completion in ONE transaction.

            with ctx.atomic() as done:
                Invoice.objects.create(...)
                done.result = {"invoice": invoice.pk}

        If the lease is gone when the block ends, LostLease is raised inside
        the transaction, so the block's writes roll back with it.
        """
        with self._lock:
            if self.settled:
                raise LostLease(self.task_id)
        self._require_lease()
        completion = AtomicCompletion(result)
        try:
            with transaction.atomic(using=self._store.using):
                yield completion
                # Settling from here: once the commit below lands, a heartbeat
                # finds the row finished before `_settle` records it.
                row = self._owned_settle(
                    lambda: self._store.complete(self.task_id, self._worker_id, completion.result)
                )
        except BaseException:
            self._abort_settling()
            raise
        # Marked settled only once committed: a failed commit leaves the task
        # to the worker (or to lease recovery), never silently "done".
        with self._lock:
            self._settle(row)

    # ------------------------------------------------------------ children
    def submit(self, name: str, payload: Any = None, **options: Any) -> TaskRecord:
        """Submit a child task (parent_id, root_id and correlation_id are filled in).

        Takes enqueue()'s options (queue, key, conflict, priority, max_attempts,
        metadata, delay, run_at). Inside `ctx.atomic()` the child commits with
        this task's completion.

        Refused once the lease is lost: the attempt is being redone elsewhere,
        and that retry will submit its own children.
        """
        self._require_lease()
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
    async def run_db(self, fn: Callable[[], Any]) -> Any:
        """Run `fn`, database work of an async handler, off the event loop.

        In a worker, on its database threads, as the twins below; in
        cairnq_django.testing, which has no such threads, on the thread that
        runs the test, so the work shares the test's connection.
        """
        if self._db_executor is None:
            return await sync_to_async(fn, thread_sensitive=True)()
        return await self._run_db(fn)

    async def _run_db(self, fn: Callable[[], Any]) -> Any:
        def call() -> Any:
            try:
                return fn()
            finally:
                close_old_connections()

        return await asyncio.get_running_loop().run_in_executor(self._db_executor, call)

    async def aprogress(self, value: float | None, message: str | None = None) -> TaskRecord:
        return await self._run_db(partial(self.progress, value, message))

    async def aheartbeat(self) -> TaskRecord:
        return await self._run_db(self.heartbeat)

    async def acanceled(self) -> bool:
        if self._cancel_seen:
            return True
        return await self._run_db(self.canceled)

    async def asucceed(self, result: Any = None) -> TaskRecord | None:
        return await self._run_db(partial(self.succeed, result))

    async def afail(
        self, error: Any = "The task failed.", *, retryable: bool = True
    ) -> TaskRecord | None:
        return await self._run_db(partial(self.fail, error, retryable=retryable))

    async def asnooze(self, delay: float | timedelta) -> TaskRecord | None:
        return await self._run_db(partial(self.snooze, delay))

    async def asubmit(self, name: str, payload: Any = None, **options: Any) -> TaskRecord:
        return await self._run_db(partial(self.submit, name, payload, **options))
