"""wait()/call(): poll a task's status until it finishes, with growing intervals.

A wait outlives a database restart. A probe that fails because the connection
broke (OperationalError/InterfaceError with the connection found unusable)
closes that connection and probes again with a backoff of its own, 50 ms
doubling to the poll ceiling, until the wait's timeout; Django opens a new
connection on the next query. The process logs one warning when an outage of
a database begins (however many waits notice it, however often they retry)
and one info line when a wait reaches it again. The Postgres wakeup listener
reconnects by itself (cairnq_django/wakeup/), and its sleeps never last longer
than the poll interval asked for, so a dead LISTEN connection only means plain
polling. The sleeps between probes are the alias's wakeup (wakeup.get_wakeup),
the one the worker's idle wait uses too.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, connections

from .conf import cairnq_settings
from .connection_options import apply_to_open_connection
from .errors import CairnQError, TaskCanceled, TaskFailed, TaskTimeout
from .pooling import release
from .records import TaskRecord, TaskStatus
from .wakeup import get_wakeup

if TYPE_CHECKING:
    from .store import ApplicationOperations

logger = logging.getLogger("cairnq_django.wait")

# The first pause after a probe lost the database; it doubles up to the poll ceiling.
RECONNECT_INITIAL_S = 0.05

# alias -> when some wait of this process first found it unreachable; cleared
# by the next probe that works. Keeps the log at one warning per outage.
_down_since: dict[str, float] = {}
_down_lock = threading.Lock()


def refuse_inside_transaction(using: str) -> None:
    """Raise CairnQError if an atomic block is open on `using`; the message says why."""
    if connections[using].in_atomic_block:
        raise CairnQError(
            f"wait()/call() was called inside an open transaction on database {using!r}. "
            "A worker cannot see a task this transaction has not committed, and a wait "
            "here would also hold the transaction open. Call it after the transaction "
            "commits (for example from transaction.on_commit)."
        )


def _drop_if_broken(alias: str) -> bool:
    """After a connection-class error: close the connection if it broke; say whether it did.

    False means the connection still works, so the error was about the query
    (SQLite reports a missing table as an OperationalError too) and retrying
    would not help. Django's close_if_unusable_or_obsolete() cannot tell the
    two apart under CONN_MAX_AGE=0, where it closes every connection, hence
    the explicit health check. A wait is never inside an atomic block on this
    alias (refused up front), so closing cannot cut a caller's transaction short.
    """
    conn = connections[alias]
    try:
        # None: the connect itself failed. is_usable() runs SELECT 1 on
        # PostgreSQL; it is only reached after an error.
        broken = conn.connection is None or not conn.is_usable()
    except Exception:
        broken = True
    if broken:
        with suppress(Exception):
            conn.close()
    return broken


def _explain(snapshot: TaskRecord | None, waited_s: float, key: str | None) -> str:
    what = f"key {key!r}" if key else "the task"
    if snapshot is None:
        return f"Timed out after {waited_s:.1f}s waiting for {what}: no such task exists (yet)."
    prefix = f"Timed out after {waited_s:.1f}s waiting for task {snapshot.id} ({snapshot.name})"
    if snapshot.status == "queued":
        return (
            f"{prefix}: it is still queued and was never claimed (attempt "
            f"{snapshot.attempt}/{snapshot.max_attempts}). Likely causes: no worker is running, "
            f"no worker has a handler named {snapshot.name!r}, no worker watches queue "
            f"{snapshot.queue!r}, or the worker uses a different database. "
            "The task keeps its place in the queue."
        )
    if snapshot.status == "running":
        return (
            f"{prefix}: it is still running on worker {snapshot.worker_id} (attempt "
            f"{snapshot.attempt}/{snapshot.max_attempts}). It keeps running; wait again "
            "with a longer timeout."
        )
    return f"{prefix}: it is {snapshot.status}."


class _Poll:
    """One wait's state: the probe, the growing interval and the deadline.

    Built, and probed, on the thread whose connection the wait uses.
    """

    def __init__(
        self,
        store: ApplicationOperations,
        *,
        task_id: str | None = None,
        key: str | None = None,
        timeout: float | None = None,
        poll_initial_ms: int | None = None,
        poll_max_ms: int | None = None,
        raise_on_failure: bool = True,
    ) -> None:
        refuse_inside_transaction(store.using)
        self.store, self.task_id, self.key = store, task_id, key
        # What the wait looks up: the task id, or the key (exactly one is given).
        if key is not None and task_id is None:
            self.lookup = key
        elif task_id is not None and key is None:
            self.lookup = task_id
        else:
            raise ValueError("A wait is for a task id or for a key: pass exactly one.")
        self.raise_on_failure = raise_on_failure
        # Floored at 1 ms: a zero interval would never grow and spin on the database.
        self.interval = max(1, poll_initial_ms or cairnq_settings.WAIT_POLL_INITIAL) / 1000
        self.ceiling = max(1, poll_max_ms or cairnq_settings.WAIT_POLL_MAX) / 1000
        self.started = time.monotonic()
        self.deadline: float | None = None if timeout is None else self.started + timeout
        self.probed_id: str | None = task_id
        # Database outages seen by this wait: when the current one began
        # (None: the last probe worked) and their total length so far.
        self.outage_since: float | None = None
        self.outage_total = 0.0
        self.reconnect_interval = min(RECONNECT_INITIAL_S, self.ceiling)
        self._tuned: object = None  # the raw connection given TCP options last

    def probe(self) -> TaskRecord | None:
        """Probe once: the final row, None to keep waiting, or raise.

        A probe that lost the database connection counts as "keep waiting"
        until the deadline, then raises TaskTimeout saying so. On "keep
        waiting" the connection goes back to its pool before the wait sleeps:
        many waits in one process must not each hold a pool slot while asleep.
        """
        try:
            task = self._check()
        except (OperationalError, InterfaceError) as exc:
            if not _drop_if_broken(self.store.using):
                raise
            self._lost(exc)
            task = None
        if task is None:
            release(self.store.using)
        return task

    def _answered(self) -> None:
        """The database answered a probe: end this wait's outage, if any."""
        if self.outage_since is not None:
            self.outage_total += time.monotonic() - self.outage_since
            self.outage_since = None
        if self.store.using in _down_since:
            # The first working probe after an outage, whichever wait's it is.
            with _down_lock:
                since = _down_since.pop(self.store.using, None)
            if since is not None:
                logger.info(
                    "wait() for %s reached database %r again, %.1fs after it was first found "
                    "unreachable.",
                    self._subject(), self.store.using, time.monotonic() - since,
                )

    def _subject(self) -> str:
        return f"key {self.key!r}" if self.key else f"task {self.task_id}"

    def _lost(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.outage_since is None:
            self.outage_since = now
            self.reconnect_interval = min(RECONNECT_INITIAL_S, self.ceiling)
            with _down_lock:
                first = self.store.using not in _down_since
                _down_since.setdefault(self.store.using, now)
            if first:
                logger.warning(
                    "wait() for %s lost its connection to database %r (%s); waits reconnect "
                    "with backoff until their timeouts.",
                    self._subject(), self.store.using, str(exc).strip(),
                )
        if self.deadline is not None and now >= self.deadline:
            raise TaskTimeout(
                f"Timed out after {now - self.started:.1f}s waiting for {self._subject()}: "
                f"the database {self.store.using!r} was unreachable at the end (for the "
                f"last {now - self.outage_since:.1f}s; last error: {str(exc).strip()}). "
                "The task's state is unknown; whatever it is, the wait did not change it.",
                # The last id the probe saw; for a key that never resolved, the key.
                task_id=self.probed_id if self.probed_id is not None else self.lookup,
                key=self.key,
                snapshot=None,
            ) from exc

    def _check(self) -> TaskRecord | None:
        store, key = self.store, self.key
        self._tcp_options()
        probe: TaskStatus | None = (
            store.get_status(self.lookup) if key is None else store.get_status_by_key(key)
        )
        # Before anything can raise: a TaskFailed or a timeout found on the
        # first probe after an outage still ends it.
        self._answered()
        if probe is not None:
            self.probed_id = probe.id
        if probe is not None and probe.is_terminal:
            # Re-read the whole row only now; a purge or a key repoint in
            # between simply means we keep waiting.
            task = store.get(probe.id)
            if task is not None and task.is_terminal and (key is None or probe.id == task.id):
                if self.raise_on_failure and task.status == "failed":
                    raise TaskFailed(task)
                if self.raise_on_failure and task.status == "canceled":
                    raise TaskCanceled(task)
                return task
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            snapshot = store.get(self.lookup) if key is None else store.get_by_key(key)
            message = _explain(snapshot, now - self.started, key)
            if self.outage_total:
                message += (
                    f" The database {store.using!r} was unreachable for "
                    f"{self.outage_total:.1f}s of the wait."
                )
            raise TaskTimeout(
                message,
                # A key that points at nothing has no id to report: the key
                # stands in for it, as in the protocol's SDKs.
                task_id=snapshot.id if snapshot else self.lookup,
                key=key,
                snapshot=snapshot,
            )
        return None

    def _tcp_options(self) -> None:
        """Give the connection this wait probes on CairnQ's TCP options, once per connection.

        So a probe on a connection the network stopped carrying fails in
        seconds (and the wait reconnects) instead of hanging until TCP gives up.
        """
        connection = connections[self.store.using]
        connection.ensure_connection()
        raw = connection.connection
        if raw is not None and raw is not self._tuned:
            apply_to_open_connection(self.store.using)
            self._tuned = raw

    def next_sleep(self) -> float:
        """Seconds to sleep before the next probe; grows the interval for the one after."""
        if self.outage_since is not None:
            # Reconnecting: a backoff of its own, so a short outage is over
            # in about its own length whatever the poll interval had grown to.
            sleep_for = self.reconnect_interval
            self.reconnect_interval = min(self.reconnect_interval * 2, self.ceiling)
        else:
            sleep_for = self.interval
            self.interval = min(self.interval * 1.5, self.ceiling)
        if self.deadline is not None:
            sleep_for = max(0.0, min(sleep_for, self.deadline - time.monotonic()))
        return sleep_for


def wait(store: ApplicationOperations, **options: Any) -> TaskRecord:
    """Block until the task reaches a terminal status and return its final row.

    `options` are _Poll's: task_id or key (exactly one), timeout (seconds),
    poll_initial_ms, poll_max_ms, raise_on_failure.
    """
    poll = _Poll(store, **options)
    while (task := poll.probe()) is None:
        # Woken early when the task (or, before its id is known, any task) finishes.
        get_wakeup(store.using).wait_for_done(poll.probed_id, poll.next_sleep())
    return task


async def await_(store: ApplicationOperations, **options: Any) -> TaskRecord:
    """The async twin of wait() (the same options): probes on Django's thread, sleeps on the
    event loop.

    Sleeping with asyncio rather than in a worker thread keeps a long wait from
    occupying a thread, and keeps every query on the thread-sensitive executor
    whose connection Django closes (a connection opened in an arbitrary pool
    thread would stay open for the life of the process).
    """
    from asgiref.sync import sync_to_async

    poll = await sync_to_async(_Poll)(store, **options)

    def probe() -> TaskRecord | None:
        try:
            return poll.probe()
        finally:
            # That thread serves every sync_to_async call: it keeps no pool slot
            # after, even after the last probe (poll.probe() gives the
            # connection back only when the wait goes on to sleep).
            release(store.using)

    on_thread = sync_to_async(probe)
    while (task := await on_thread()) is None:
        await get_wakeup(store.using).await_done(poll.probed_id, poll.next_sleep())
    return task
