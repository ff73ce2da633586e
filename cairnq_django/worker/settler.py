"""Group commit for the completions of finished calls.

A no-op task costs two transactions, its claim and its completion, and the
completion's commit is the larger part: on PostgreSQL each commit waits for
a WAL flush, and on SQLite eight handler threads committing at once queue in
SQLite's busy handler, which sleeps in steps of milliseconds. So handler
threads hand their completions to one settler thread; the settler writes
whatever has gathered, each row with its own ownership check, in one short
transaction, then gives every completion its own outcome. Nothing waits on
purpose to make a group larger: completions that arrive while one group is
being written form the next.

A completion queued with complete() is waited for by its handler thread. The
common one, a one-task call that returned, is queued with complete_later()
instead: its handler thread moves on at once (no sleep and wake-up per task),
and the settler thread itself, right after the commit, passes the outcome
to the worker's callback, which settles the context, reports the end and
releases the call. Either way the outcome (the written row, LostLease, or
the database error) is known before the call is released, so a completion
is never reported, signalled or counted before it is committed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import connections
from django.db.utils import InterfaceError, OperationalError

from ..errors import LostLease
from ..pooling import release
from ..records import TaskRecord
from ..store.encoding import encode_result
from ..store.leases import LeaseOperations
from ..store.timeouts import bounded_statements

logger = logging.getLogger("cairnq_django.worker")

# Bounds one group's transaction (and so how long it holds SQLite's write lock).
MAX_GROUP = 64
# Retrying a completion through an outage: the first pause, and the longest.
RETRY_INITIAL_S = 0.1
RETRY_MAX_S = 2.0
# Past the computed expiry, in case the database's clock runs a little slow
# against ours; a retry after the lease is gone writes nothing anyway.
LEASE_SLACK_S = 1.0


@dataclass(slots=True, eq=False)
class _Item:
    """One completion, whose outcome the settler sets once and passes to its callback."""

    task_id: str
    worker_id: str
    result_json: str | None
    # The outcome is passed to it on the settler thread (complete() waits on
    # a lock that its callback releases).
    then: Callable[[TaskRecord | None, BaseException | None], None]
    _set: bool = field(default=False, init=False)

    def done(self) -> bool:
        return self._set

    def settle(self, row: TaskRecord | None, error: BaseException | None) -> None:
        if self._set:
            raise RuntimeError(f"the completion of {self.task_id} was settled twice")
        self._set = True
        try:
            self.then(row, error)
        except Exception:
            # The callback reports its own failures; the settler must outlive it.
            logger.exception("Handling the outcome of the completion of %s failed.", self.task_id)


class _GaveUp(Exception):
    """Retrying a group's write ended with every item given its outcome."""


class Settler:
    """One thread that commits completions in groups for the handler threads."""

    def __init__(
        self, store: LeaseOperations, *, write_gate: AbstractContextManager[Any],
        statement_timeout_ms: int | None = None,
        lease_expired_by: Callable[[str], float | None] | None = None,
        lease_ms: int | None = None,
    ) -> None:
        self.store = store
        self.statement_timeout_ms = statement_timeout_ms
        # When a task's lease has certainly expired (monotonic), for the retries.
        self._lease_expired_by = lease_expired_by
        self._lease_s = lease_ms / 1000 if lease_ms else None
        # Set when the worker stops waiting for this thread: retries end.
        self._give_up = threading.Event()
        # Shared with the worker's claim loop on SQLite, so the two take the
        # write lock in turn instead of meeting in SQLite's busy handler.
        self._gate = write_gate
        self._items: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="cairnq-settler", daemon=True)
        # Guards the queue's end: nothing is queued after the stop marker.
        self._open_lock = threading.Lock()
        self._open = False
        # The ids of the statements being written, for the heartbeat to skip:
        # their rows stay locked until those commits are flushed. (Writes
        # alone, after stop, may run on several handler threads at once.)
        self._committing: Counter[str] = Counter()
        self._committing_lock = threading.Lock()
        self.groups = 0
        self.settled = 0

    def committing(self) -> frozenset[str]:
        """The task ids whose completion is being written right now."""
        with self._committing_lock:
            return frozenset(self._committing)

    def waiting(self) -> int:
        """How many completions are queued for the next group."""
        return self._items.qsize()

    def start(self) -> None:
        with self._open_lock:
            self._open = True
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, then end the thread; later completions are written alone."""
        with self._open_lock:
            if not self._open:
                return
            self._open = False
            self._items.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():  # retrying through an outage: leave it to recovery
            self._give_up.set()
            self._thread.join(1.0)

    def complete(self, task_id: str, worker_id: str, result: Any) -> TaskRecord:
        """Complete one run through the next group; block until it is committed.

        Raises SerializationError (before queueing), LostLease, or the
        database error that the group met twice.
        """
        encoded = encode_result(result)
        # A bare lock, held until the outcome is set, is the whole hand-off: a
        # concurrent.futures.Future would build a Condition, its lock and a
        # waiter lock for every task.
        ready = threading.Lock()
        ready.acquire()
        outcome: list[Any] = []

        def then(row: TaskRecord | None, error: BaseException | None) -> None:
            outcome[:] = row, error
            ready.release()

        if not self.complete_later(task_id, worker_id, encoded, then):
            # The settler is stopping: written alone, on this thread.
            row = self._write([(task_id, worker_id, encoded)])[0]
            if row is None:
                raise LostLease(task_id)
            return row
        ready.acquire()
        row, error = outcome
        if error is not None:
            raise error
        return cast(TaskRecord, row)

    def complete_later(
        self, task_id: str, worker_id: str, result_json: str | None,
        then: Callable[[TaskRecord | None, BaseException | None], None],
    ) -> bool:
        """Queue a completion (its result already encoded) without waiting for it.

        Once the group that holds it is committed (or has failed), `then(row,
        error)` runs on the settler thread: the written row, or None and
        LostLease or the database error that the group met twice. Returns
        False, queueing nothing, once the settler is stopping.
        """
        item = _Item(task_id, worker_id, result_json, then)
        with self._open_lock:
            if not self._open:
                return False
            self._items.put(item)
        return True

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        with bounded_statements(self.statement_timeout_ms):
            try:
                while True:
                    first = self._items.get()
                    if first is None:
                        return
                    group = [first]
                    stopping = False
                    while len(group) < MAX_GROUP:
                        try:
                            item = self._items.get_nowait()
                        except queue.Empty:
                            break
                        if item is None:
                            stopping = True
                            break
                        group.append(item)
                    self._write_group(group)
                    if self._items.empty():
                        release(self.store.using)  # not held while no completion waits
                    if stopping:
                        return
            finally:
                self._fail_leftovers()
                connections.close_all()

    def _write_group(self, group: list[_Item]) -> None:
        try:
            group, rows = self._attempt(group)
        except _GaveUp:
            return  # every item has its outcome
        except Exception as exc:
            group = [item for item in group if not item.done()]  # some may be given up
            if len(group) == 1:
                group[0].settle(None, exc)
                return
            # Whatever broke the group may be one row's doing: settle each alone
            # so the others are not held hostage to it.
            logger.warning(
                "Writing %d completions together failed (%s); writing them one by one.",
                len(group), exc,
            )
            for item in group:
                # A group of one: a lost connection is retried as for any group.
                self._write_group([item])
            return
        self.groups += 1
        self.settled += sum(row is not None for row in rows)
        for item, row in zip(group, rows, strict=True):  # a row per item, None if lost
            item.settle(row, None if row is not None else LostLease(item.task_id))

    def _attempt(self, group: list[_Item]) -> tuple[list[_Item], list[TaskRecord | None]]:
        """Write the group, retrying a lost connection while a lease could still be valid.

        The tasks are done: dropping a completion over a broken connection
        hands the task to lease recovery, which runs it again. So a write that
        fails on the connection is retried on a fresh one, at once and then
        with backoff, for as long as any of the tasks' leases could still be
        valid (renewals go on meanwhile). An item whose lease has certainly
        expired is given up (its error set, left to recovery); a retry that
        finds a lease taken writes nothing, by the statement's ownership check.
        Returns the items still being written, with their rows.
        """
        delay = 0.0  # the first retry at once: most often the server closed an idle session
        # Renewals that keep passing while completions keep failing mean the
        # database refuses the write itself: one lease of retries is enough.
        give_up_at = time.monotonic() + self._lease_s if self._lease_s else None
        while True:
            batch = [(i.task_id, i.worker_id, i.result_json) for i in group]
            try:
                return group, self._write(batch)
            except (OperationalError, InterfaceError) as exc:
                connections[self.store.using].close()
                group = self._still_valid(group, exc, retried=delay > 0, give_up_at=give_up_at)
                if not group:
                    raise _GaveUp from exc
                if self._give_up.wait(delay):
                    for item in group:
                        item.settle(None, exc)
                    raise _GaveUp from exc
                delay = min(RETRY_MAX_S, max(RETRY_INITIAL_S, delay * 2))

    def _still_valid(
        self, group: list[_Item], exc: Exception, *, retried: bool, give_up_at: float | None
    ) -> list[_Item]:
        """The items worth another write; the others get `exc` as their outcome."""
        now = time.monotonic()
        keep = []
        for item in group:
            expired_by = self._lease_expired_by(item.task_id) if self._lease_expired_by else None
            if expired_by is not None and give_up_at is not None:
                expired_by = min(expired_by, give_up_at - LEASE_SLACK_S)
            # Unknown lease: one more write at once, then it is recovery's.
            if (now < expired_by + LEASE_SLACK_S) if expired_by is not None else not retried:
                keep.append(item)
                continue
            logger.warning(
                "Gave up writing the completion of %s: the database was unreachable (%s) until "
                "its lease had expired. Lease recovery will run it again.",
                item.task_id, str(exc).strip(),
            )
            item.settle(None, exc)
        if keep and not retried:
            logger.warning(
                "Writing %d completion(s) failed on the connection (%s); retrying on a fresh "
                "one while their leases last.", len(keep), str(exc).strip(),
            )
        return keep

    def _write(self, batch: list[tuple[str, str, str | None]]) -> list[TaskRecord | None]:
        ids = Counter(task_id for task_id, _, _ in batch)
        with self._gate:
            with self._committing_lock:
                self._committing.update(ids)
            try:
                return self.store.complete_encoded_many(batch)
            finally:
                with self._committing_lock:
                    self._committing.subtract(ids)
                    self._committing += Counter()  # drop the ids now at zero

    def _fail_leftovers(self) -> None:
        # Only reachable if the thread dies: a waiter must not block forever.
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return
            if item is not None and not item.done():
                item.settle(
                    None, RuntimeError("the settler thread stopped before writing this completion")
                )
