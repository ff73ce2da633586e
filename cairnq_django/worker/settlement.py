"""Settlement: one attempt's ownership of its task and the one write that settles it.

A TaskContext holds one; the handler's calls (succeed, fail, snooze, atomic,
progress...) and the worker's (execution.py settling what a call left, the
settler finishing a completion, the heartbeat flagging a lost lease, the
watchdog and shutdown abandoning a call) meet here, under one lock and one
lost-lease flag:

- a settle happens at most once: whichever write settles the attempt first
  wins, and every later one is a no-op (or LostLease for a write that needs
  the lease);
- once the lease is flagged lost nothing more is written locally, besides
  the store's own ownership check: an abandoned attempt's task may be claimed
  again by this same worker id, and a zombie handler's write would then pass
  that check;
- a settling write raises the "settling" flag before it is sent, so a
  heartbeat that finds the row already finished does not take it for a lost
  lease.

Lock order: `_lock` (held across a write) before `_state_lock` (never held
across a database call, so the heartbeat asking about a task never waits
behind a write).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from django.db import connections, transaction
from django.db.utils import InterfaceError, OperationalError

from ..errors import LostLease, SerializationError
from ..records import TaskRecord
from ..store.leases import LeaseOperations
from .backoff import retry_delay_ms
from .envelopes import unserializable_envelope


class _OwnershipLock:
    """The attempt's lock: an RLock that also waits out a completion being written elsewhere.

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


class Settlement:
    """The ownership and settle state of one claimed attempt."""

    def __init__(
        self,
        *,
        store: LeaseOperations,
        task: TaskRecord,
        worker_id: str,
        lease_ms: int,
        backoff: tuple[int, int] = (1_000, 30_000),
        retries: bool = True,
    ) -> None:
        #: Where the settling writes go (a workflow step's: StepSettling).
        self.store = store
        self._task = task
        self._worker_id = worker_id
        self._lease_ms = lease_ms
        self._backoff = backoff
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
        #: Whether a cancel was seen on the row (a write's answer, a heartbeat, a read).
        self.cancel_seen = False
        self.settled = False
        #: The row as the settling write left it (None until settled here).
        self.final: TaskRecord | None = None
        #: The backoff (ms) of the fail that settled it, if one did (its error is on `final`).
        self.retry_ms: int | None = None
        #: The delay (ms) of the snooze that settled it, if one did.
        self.snoozed_ms: int | None = None
        #: Set once the worker logged this attempt's end and sent its signal.
        self.ended = False
        # When (monotonic) the last claim or renewal of the lease answered:
        # the server set its expiry no later than that, so the lease has
        # certainly expired one lease after it (see lease_expired_by).
        self.lease_renewed_at = time.monotonic()

    @property
    def task_id(self) -> str:
        return self._task.id

    # ------------------------------------------------------------ lease state
    @property
    def lost_lease(self) -> bool:
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

    def _set_settling(self, settling: bool) -> None:
        with self._state_lock:
            self._settling = settling

    def observe_cancel(self, cancel_requested: bool) -> None:
        if cancel_requested:
            self.cancel_seen = True

    def lease_expired_by(self) -> float:
        """The monotonic time by which this attempt's lease has certainly expired, unless renewed."""
        return self.lease_renewed_at + self._lease_ms / 1000

    def require_lease(self) -> None:
        if self._lost:
            raise LostLease(self.task_id)

    # ------------------------------------------------------------ owned writes
    def owned(self, write: Callable[[], TaskRecord], *, settling: bool = False) -> TaskRecord:
        """Run an ownership-checked write; `settling` marks one that ends the attempt.

        A settling write leaves the attempt settling until `_settle` records
        its row (the caller's job, under `_lock`), or until it raises.
        """
        with self._lock:
            self.require_lease()
            if self.settled:
                # Already finished through this attempt: the row is terminal,
                # and reporting that as a lost lease would be misleading.
                raise LostLease(self.task_id)
            if settling:
                self._set_settling(True)
            try:
                row = write()
            except BaseException as exc:
                if isinstance(exc, LostLease):
                    self.mark_lost_lease()
                if settling:
                    self._set_settling(False)
                raise
            self.observe_cancel(row.cancel_requested)
            return row

    def _settle(self, row: TaskRecord) -> None:
        self.final = row
        with self._state_lock:
            self.settled = True
            self._settling = False

    def retry_delay_ms(self) -> int:
        base, cap = self._backoff
        return retry_delay_ms(self._task.attempt, base_ms=base, cap_ms=cap)

    # ------------------------------------------------------------ settling
    # The handler settles through complete (succeed), fail and snooze: settling
    # twice is a no-op that returns None, and a lost lease raises LostLease.
    # The worker settles what a call left unsettled through the same methods
    # with `by_worker=True`: each does nothing (and returns None) once the
    # attempt is settled or its lease is lost, and each write is worth one
    # reconnect: the handler's work is done, and losing its settle to a
    # connection the server dropped would run it again.

    def _may_settle(self, by_worker: bool) -> bool:
        """Whether a settle still has something to write; the caller holds `_lock`."""
        return not (self.settled or by_worker and self._lost)

    def _write_settle(
        self, write: Callable[[], TaskRecord], by_worker: bool, *,
        retry_ms: int | None = None, snoozed_ms: int | None = None,
    ) -> TaskRecord:
        """Run a write that ends the attempt, then record how it did; the caller holds `_lock`."""
        owned = partial(self.owned, write, settling=True)
        row = self._once_more(owned) if by_worker else owned()
        self.retry_ms, self.snoozed_ms = retry_ms, snoozed_ms
        self._settle(row)
        return row

    def succeed(self, result: Any) -> TaskRecord | None:
        return self.complete(lambda: self.store.complete(self.task_id, self._worker_id, result))

    def complete(self, write: Callable[[], TaskRecord], *, by_worker: bool = False) -> TaskRecord | None:
        """Complete the task through `write` (the worker's group commit, say).

        By the worker, a result that cannot be stored as JSON fails the task
        permanently instead; the handler gets the SerializationError.
        """
        with self._lock:
            if not self._may_settle(by_worker):
                return None
            try:
                return self._write_settle(write, by_worker)
            except SerializationError as exc:
                if not by_worker:
                    raise
                return self.fail_unserializable(exc)

    def fail(
        self, envelope: dict[str, Any], retryable: bool, *, by_worker: bool = False
    ) -> TaskRecord | None:
        """Fail the task with `envelope`, with backoff while attempts remain if retryable."""
        with self._lock:
            if not self._may_settle(by_worker):
                return None
            return self._fail_owned(envelope, retryable, by_worker)

    def snooze(self, delay_ms: int, *, by_worker: bool = False) -> TaskRecord | None:
        with self._lock:
            if not self._may_settle(by_worker):
                return None
            return self._write_settle(
                lambda: self.store.snooze(
                    self.task_id, self._worker_id, delay_ms, started_at_ms=self._task.updated_at_ms
                ),
                by_worker, snoozed_ms=delay_ms,
            )

    def fail_unserializable(self, exc: SerializationError) -> TaskRecord:
        """Fail the task for good: its result cannot be stored as JSON, and no retry changes that."""
        with self._lock:
            return self._fail_owned(unserializable_envelope(exc), False)

    def _fail_owned(self, envelope: dict[str, Any], retryable: bool, by_worker: bool = False) -> TaskRecord:
        retryable = retryable and self._retries
        delay = self.retry_delay_ms() if retryable else 0
        return self._write_settle(
            lambda: self.store.fail(
                self.task_id, self._worker_id, envelope, retryable=retryable, delay_ms=delay,
                started_at_ms=self._task.updated_at_ms,  # the claim's stamp: the attempt's start
            ),
            by_worker, retry_ms=delay,
        )

    @contextmanager
    def atomic(self, result: Callable[[], Any]) -> Iterator[None]:
        """Run the block and the completion with `result()` in one transaction.

        If the lease is gone when the block ends, LostLease is raised inside
        the transaction, so the block's writes roll back with it.
        """
        with self._lock:
            if self.settled:
                raise LostLease(self.task_id)
        self.require_lease()
        try:
            with transaction.atomic(using=self.store.using):
                yield
                # Settling from here: once the commit below lands, a heartbeat
                # finds the row finished before `_settle` records it.
                row = self.owned(
                    lambda: self.store.complete(self.task_id, self._worker_id, result()),
                    settling=True,
                )
        except BaseException:
            self._set_settling(False)
            raise
        # Marked settled only once committed: a failed commit leaves the task
        # to the worker (or to lease recovery), never silently "done".
        with self._lock:
            self._settle(row)

    # ------------------------------------------------------------ completing on the settler thread
    def begin_completion(self) -> bool:
        """Start a completion that another thread writes; False if there is nothing to complete.

        The attempt is settling from here, as during a `complete` by the
        worker, and the lock's next holder waits until `end_completion`
        reports the write's outcome.
        """
        with self._lock:
            if not self._may_settle(by_worker=True):
                return False
            pending = threading.Lock()
            pending.acquire()
            self._set_settling(True)
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
                lambda: self.store.fail(
                    self.task_id, self._worker_id, envelope, retryable=True, delay_ms=delay,
                    started_at_ms=self._task.updated_at_ms,
                )
            )
            self.retry_ms = delay
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
            connections[self.store.using].close()
            return write()
