"""Wake sleepers early when the queue changes: LISTEN on Postgres, data_version on SQLite.

A wake is only ever a hint. Workers and wait() poll the database anyway; a
wake shortens the sleep between two polls and nothing else, so every failure
here (no psycopg, a dropped connection, a locked file) degrades to a plain
sleep for the requested time.

`get_wakeup(alias)` returns the process-wide Wakeup for a database alias. Its
two waits return True when they were woken and False when they timed out.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from django.db import connections

from .conf import cairnq_settings
from .ids import now_ms

logger = logging.getLogger("cairnq_django.wakeup")

QUEUED_CHANNEL = "cairnq_queued"
DONE_CHANNEL = "cairnq_done"

# How often a Postgres listener leaves notifies() to check for close().
LISTEN_SLICE_S = 0.25
# Reconnect backoff for the listener connection (doubles up to the cap).
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0
# How many finished task ids a Postgres wakeup remembers for a waiter that
# registers just after the notification arrived.
RECENT_DONE_LIMIT = 1024
# SQLite change polling: PRAGMA data_version on a dedicated connection, only
# while some thread is waiting. The interval starts short after a change (the
# next one tends to follow soon) and doubles to a ceiling while nothing
# changes, which keeps an idle worker near 1% of a core (docs/wakeups.md).
SQLITE_POLL_MIN_S = 0.001
SQLITE_POLL_MAX_S = 0.005
# With an inotify watch on the file, the poller blocks on it once the
# interval has grown to the maximum; this long sleep only guards against a
# write the watch did not report.
SQLITE_WATCHED_SLEEP_S = 0.5


class Wakeup:
    """Sleep for the whole timeout: the fallback when no change signal is available."""

    def ready(self, timeout_s: float) -> bool:
        """Start listening and return whether wakes can arrive (False: plain sleeps)."""
        return False

    def wait_for_queued(self, queues: Sequence[str], timeout_s: float) -> bool:
        """Sleep until work may have arrived on one of `queues`, or until the timeout."""
        _sleep(timeout_s)
        return False

    def wait_for_done(self, task_id: str | None, timeout_s: float) -> bool:
        """Sleep until the task (any task for None) may have finished, or until the timeout."""
        _sleep(timeout_s)
        return False

    async def await_done(self, task_id: str | None, timeout_s: float) -> bool:
        """Sleep on the event loop like wait_for_done(), without occupying a thread."""
        if timeout_s > 0:
            await asyncio.sleep(timeout_s)
        return False

    def close(self) -> None:
        """Release the connection and thread behind this wakeup."""

    @property
    def waiting(self) -> int:
        """Return how many threads are inside a wait right now."""
        return 0


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


class _Waits:
    """Bookkeeping shared by the signalling wakeups: a condition and a waiter count."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting = 0
        self._closed = False
        # Callbacks that wake coroutines waiting on an event loop.
        self._hooks: set = set()

    def _wake_all(self) -> None:
        """Wake every waiter, threads and coroutines (call with the lock held)."""
        self._cond.notify_all()
        for hook in list(self._hooks):
            hook()

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._waiting

    def _wait_until(self, predicate, timeout_s: float) -> bool:
        """Wait on the condition for `predicate` (called with the lock held)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            if self._closed:
                # Keep a caller that still holds a closed wakeup paced, not spinning.
                self._cond.wait(max(0.0, timeout_s))
                return False
            self._waiting += 1
            if self._waiting == 1:
                self._wake_all()  # an idle SQLite poller resumes
            try:
                while not self._closed:
                    if predicate():
                        return True
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            finally:
                self._waiting -= 1
        return False

    async def _await_until(self, predicate, timeout_s: float) -> bool:
        """Await `predicate` (called with the lock held) on the running event loop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        event = asyncio.Event()

        def poke() -> None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:
                pass  # the loop is closed; nobody is left to wake

        with self._cond:
            if self._closed:
                closed = True
            else:
                closed = False
                self._hooks.add(poke)
                self._waiting += 1
                if self._waiting == 1:
                    self._wake_all()
        if closed:
            await asyncio.sleep(max(0.0, timeout_s))
            return False
        try:
            while True:
                # Clear before checking: a poke after the check still ends the await.
                event.clear()
                with self._cond:
                    if self._closed:
                        return False
                    if predicate():
                        return True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        finally:
            with self._cond:
                self._hooks.discard(poke)
                self._waiting -= 1


class PostgresWakeup(_Waits, Wakeup):
    """LISTEN cairnq_queued / cairnq_done on a dedicated autocommit connection."""

    def __init__(self, conn_params: dict) -> None:
        super().__init__()
        self._params = conn_params
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = False
        # Bumped on every (re)connect: notifications may have been missed, so
        # every waiter wakes and re-probes.
        self._epoch = 0
        # queue -> number of notifications seen; compared against each
        # thread's count from the end of its previous wait, so work that
        # arrived between two waits is not slept through.
        # Only queues some waiter asked about are counted (queue names are
        # open-ended), and only their notifications wake anyone.
        self._queued_seen: dict[str, int] = {}
        self._local = threading.local()
        self._done_waiting = 0
        # Every cairnq_done counts; recent task ids remember the count at
        # which they finished. A waiter wakes for finishes after its baseline.
        self._done_count = 0
        self._recent_done: OrderedDict[str, int] = OrderedDict()
        self.backend_pid: int | None = None
        self.connects = 0

    # ------------------------------------------------------------- listening
    def _start(self) -> None:
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._listen_forever, name="cairnq-wakeup-listen", daemon=True
                )
                self._thread.start()

    def ready(self, timeout_s: float) -> bool:
        self._start()
        with self._cond:
            self._cond.wait_for(lambda: self._listening or self._closed, timeout_s)
            return self._listening

    def _listen_forever(self) -> None:
        import psycopg

        backoff = RECONNECT_INITIAL_S
        while not self._stop.is_set():
            conn = None
            try:
                conn = psycopg.connect(**self._params, autocommit=True)
                conn.execute(f"LISTEN {QUEUED_CHANNEL}")
                conn.execute(f"LISTEN {DONE_CHANNEL}")
                with self._cond:
                    self._listening = True
                    self._epoch += 1
                    self.connects += 1
                    self.backend_pid = conn.info.backend_pid
                    self._wake_all()
                backoff = RECONNECT_INITIAL_S
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=LISTEN_SLICE_S):
                        self._dispatch(note.channel, note.payload)
            except Exception as exc:  # any failure means "reconnect later"
                if not self._stop.is_set():
                    logger.warning(
                        "The CairnQ wakeup listener lost its database connection (%s); "
                        "waits fall back to sleeping and it reconnects in %.1fs.",
                        exc,
                        backoff,
                    )
            finally:
                with self._cond:
                    self._listening = False
                    self.backend_pid = None
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
            self._stop.wait(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _dispatch(self, channel: str, payload: str) -> None:
        with self._cond:
            if channel == QUEUED_CHANNEL:
                if payload not in self._queued_seen:
                    return
                self._queued_seen[payload] += 1
            elif channel == DONE_CHANNEL:
                self._done_count += 1
                self._recent_done[payload] = self._done_count
                self._recent_done.move_to_end(payload)
                while len(self._recent_done) > RECENT_DONE_LIMIT:
                    self._recent_done.popitem(last=False)
                if not self._done_waiting:
                    # Idle workers wait on queues; a busy system's stream of
                    # finishes need not wake them.
                    return
            self._wake_all()

    # ----------------------------------------------------------------- waits
    def wait_for_queued(self, queues: Sequence[str], timeout_s: float) -> bool:
        self._start()
        queues = list(queues)
        with self._cond:
            last = getattr(self._local, "queued", None)
            epoch = self._epoch
            # First wait on this thread: nothing to compare against yet.
            base = dict(last) if last else {}
            for q in queues:
                self._queued_seen.setdefault(q, 0)
                base.setdefault(q, self._queued_seen[q])

        def arrived() -> bool:
            return self._epoch != epoch or any(
                self._queued_seen.get(q, 0) != base[q] for q in queues
            )

        woken = self._wait_until(arrived, timeout_s)
        with self._cond:
            self._local.queued = {q: self._queued_seen.get(q, 0) for q in queues}
        return woken

    def _done_predicate(self, task_id: str | None, base: int | None):
        """Return a check for finishes counted after `base` (None: from now on)."""
        self._start()
        with self._cond:
            epoch = self._epoch
            if base is None:
                base = self._done_count

        def finished() -> bool:
            if self._epoch != epoch:
                return True
            if task_id is None:
                return self._done_count > base
            return self._recent_done.get(task_id, 0) > base

        return finished

    def wait_for_done(self, task_id: str | None, timeout_s: float) -> bool:
        # The baseline is where this thread's previous wait ended, so a task
        # that finished between that wait and this one wakes it at once.
        with self._cond:
            base = getattr(self._local, "done", None)
            self._done_waiting += 1
        try:
            woken = self._wait_until(self._done_predicate(task_id, base), timeout_s)
        finally:
            with self._cond:
                self._done_waiting -= 1
                self._local.done = self._done_count
        return woken

    async def await_done(self, task_id: str | None, timeout_s: float) -> bool:
        with self._cond:
            self._done_waiting += 1
        try:
            return await self._await_until(self._done_predicate(task_id, None), timeout_s)
        finally:
            with self._cond:
                self._done_waiting -= 1

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._wake_all()
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=LISTEN_SLICE_S * 8)


class SQLiteWakeup(_Waits, Wakeup):
    """Poll `PRAGMA data_version` on a dedicated connection while anyone waits.

    data_version changes whenever another connection (in any process) commits
    to the file, which makes it a cheap cross-process change signal. A change
    is then checked with one read before a queued-waiter is woken.
    """

    def __init__(
        self,
        path: str,
        *,
        poll_min_s: float = SQLITE_POLL_MIN_S,
        poll_max_s: float = SQLITE_POLL_MAX_S,
    ) -> None:
        super().__init__()
        self._path = path
        self._poll_min_s = poll_min_s
        self._poll_max_s = max(poll_min_s, poll_max_s)
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()
        self._watch: Any = None  # a FileWatch once the poller runs, where inotify exists
        self._thread: threading.Thread | None = None
        self._data_version: int | None = None
        # Number of changes seen (data_version values are per connection, so
        # waiters compare against this counter instead).
        self._changes = 0
        self._local = threading.local()
        self.broken: str | None = None
        self.failures = 0

    def _open(self) -> sqlite3.Connection:
        if self._path.startswith("file:"):
            uri = self._path
        else:
            # mode=rw: never create a missing database file.
            uri = f"file:{urllib.parse.quote(os.path.abspath(self._path))}?mode=rw"
        # A short busy timeout: a wakeup would rather miss a beat than queue
        # behind a writer (rollback-journal databases lock readers out).
        db = sqlite3.connect(
            uri, uri=True, check_same_thread=False, isolation_level=None, timeout=0.1
        )
        db.execute("PRAGMA query_only = 1")
        return db

    def _read_version(self) -> int:
        with self._db_lock:
            if self._db is None:
                self._db = self._open()
            return self._db.execute("PRAGMA data_version").fetchone()[0]

    def _start(self) -> bool:
        """Start the poller if needed; return False when the file cannot be watched."""
        with self._cond:
            if self._closed:
                return False
            if self._thread is not None:
                return True
            try:
                # Read the first value here, before any waiter registers, so a
                # commit right after this call is already a change.
                self._data_version = self._read_version()
            except sqlite3.Error as exc:
                self._note_broken(exc)
                return False
            self.broken = None
            self._thread = threading.Thread(
                target=self._poll_forever, name="cairnq-wakeup-poll", daemon=True
            )
            self._thread.start()
            return True

    def _note_broken(self, exc: Exception) -> None:
        if self.broken is None:
            logger.warning(
                "The CairnQ wakeup cannot watch %s for changes (%s); waits fall back to sleeping.",
                self._path,
                exc,
            )
        self.broken = str(exc)
        self.failures += 1
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def ready(self, timeout_s: float) -> bool:
        return self._start()

    def _poll_forever(self) -> None:
        from .filewatch import FileWatch

        if not self._path.startswith("file:"):
            self._watch = FileWatch.open(self._path)
        backoff = RECONNECT_INITIAL_S
        interval = self._poll_min_s
        while True:
            with self._cond:
                # Idle processes pay nothing: poll only while someone waits.
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    break
            try:
                version = self._read_version()
            except sqlite3.Error as exc:
                if getattr(exc, "sqlite_errorname", "") in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                    time.sleep(interval)  # a writer holds the file; ask again
                    continue
                self._note_broken(exc)
                with self._cond:
                    # A reopened connection starts a new data_version series;
                    # count the gap as a change so waiters re-probe.
                    self._data_version = None
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_S)
                continue
            backoff = RECONNECT_INITIAL_S
            self.broken = None
            with self._cond:
                if version != self._data_version:
                    self._data_version = version
                    self._changes += 1
                    self._wake_all()
                    interval = self._poll_min_s
                else:
                    interval = min(interval * 2, self._poll_max_s)
            if self._watch is not None and interval >= self._poll_max_s:
                # Quiet for a while: sleep until a process writes the file. A
                # commit writes the -wal file a moment before readers can see
                # it, so every wake first polls fast again (from the minimum).
                if self._watch.wait(SQLITE_WATCHED_SLEEP_S):
                    interval = self._poll_min_s
            else:
                time.sleep(interval)
        if self._watch is not None:
            self._watch.close()
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _has_queued(self, queues: Sequence[str]) -> bool:
        """Return whether due queued work exists on `queues` (True if unsure)."""
        marks = ", ".join("?" for _ in queues)
        try:
            with self._db_lock:
                if self._db is None:
                    return True
                row = self._db.execute(
                    "SELECT EXISTS (SELECT 1 FROM cairnq_tasks WHERE status = 'queued'"
                    f" AND queue IN ({marks}) AND run_at_ms <= ?)",
                    [*queues, now_ms()],
                ).fetchone()
            return bool(row[0])
        except sqlite3.Error:
            return True

    def _is_finished(self, task_id: str) -> bool:
        """Return whether the task is terminal or gone (True if unsure)."""
        try:
            with self._db_lock:
                if self._db is None:
                    return True
                row = self._db.execute(
                    "SELECT status FROM cairnq_tasks WHERE id = ?", [task_id]
                ).fetchone()
            return row is None or row[0] in ("succeeded", "failed", "canceled")
        except sqlite3.Error:
            return True

    def _wait_for_change(self, check, timeout_s: float) -> bool:
        """Wait until a change passes `check`; changes since this thread's last wait count."""
        if not self._start():
            _sleep(timeout_s)
            return False
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            seen = getattr(self._local, "changes", self._changes)
        woken = False
        while True:
            target = seen

            def changed() -> bool:
                return self._changes != target

            if not self._wait_until(changed, deadline - time.monotonic()):
                break
            with self._cond:
                seen = self._changes
            if check():
                woken = True
                break
        with self._cond:
            self._local.changes = self._changes
        return woken

    def wait_for_queued(self, queues: Sequence[str], timeout_s: float) -> bool:
        queues = list(queues)
        return self._wait_for_change(lambda: not queues or self._has_queued(queues), timeout_s)

    def wait_for_done(self, task_id: str | None, timeout_s: float) -> bool:
        if task_id is None:
            return self._wait_for_change(lambda: True, timeout_s)
        return self._wait_for_change(lambda: self._is_finished(task_id), timeout_s)

    async def await_done(self, task_id: str | None, timeout_s: float) -> bool:
        if not self._start():
            return await super().await_done(task_id, timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        # Coroutines share the loop's thread, so the baseline is this call's
        # entry rather than the thread's previous wait.
        with self._cond:
            seen = self._changes
        while True:
            target = seen
            if not await self._await_until(
                lambda: self._changes != target, deadline - loop.time()
            ):
                return False
            with self._cond:
                seen = self._changes
            # The read runs off the loop: a busy database must not stall it.
            if task_id is None or await asyncio.to_thread(self._is_finished, task_id):
                return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._wake_all()
        watch = self._watch
        if watch is not None:
            watch.interrupt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None


# ------------------------------------------------------------------ registry
_registry: dict[str, Wakeup] = {}
_registry_pid = os.getpid()
_registry_lock = threading.Lock()


def _postgres_params(alias: str) -> dict:
    params = dict(connections[alias].get_connection_params())
    # Django's cursor class and pool options mean nothing to a bare LISTEN connection.
    for key in ("cursor_factory", "pool"):
        params.pop(key, None)
    params.setdefault("application_name", "cairnq_django wakeup")
    return params


def _build(alias: str) -> Wakeup:
    if not cairnq_settings.WAKEUPS:
        return Wakeup()
    connection = connections[alias]
    try:
        if connection.vendor == "postgresql":
            import psycopg  # noqa: F401  (psycopg2 projects get plain sleeps)

            return PostgresWakeup(_postgres_params(alias))
        if connection.vendor == "sqlite" and not connection.is_in_memory_db():
            return SQLiteWakeup(str(connection.settings_dict["NAME"]))
    except Exception as exc:
        logger.warning(
            "CairnQ wakeups are off for database %r (%s); waits fall back to sleeping.",
            alias,
            exc,
        )
    return Wakeup()


def get_wakeup(alias: str | None = None) -> Wakeup:
    """Return this process's Wakeup for a database alias, creating it on first use."""
    global _registry_pid
    alias = alias or cairnq_settings.DATABASE
    with _registry_lock:
        if _registry_pid != os.getpid():
            # Forked: the parent's threads and sockets do not exist here.
            _registry.clear()
            _registry_pid = os.getpid()
        wakeup = _registry.get(alias)
        if wakeup is None or getattr(wakeup, "_closed", False):
            wakeup = _registry[alias] = _build(alias)
        return wakeup


def close_all() -> None:
    """Close every wakeup of this process (tests call it before dropping the database)."""
    with _registry_lock:
        wakeups = list(_registry.values()) if _registry_pid == os.getpid() else []
        _registry.clear()
    for wakeup in wakeups:
        wakeup.close()


def sleep_until_done(alias: str, task_id: str | None, seconds: float) -> None:
    """Sleep for wait()/call() between two polls, waking early when a task finishes."""
    get_wakeup(alias).wait_for_done(task_id, seconds)


async def asleep_until_done(alias: str, task_id: str | None, seconds: float) -> None:
    """Sleep for await_task()/acall() between two polls, waking early when a task finishes."""
    await get_wakeup(alias).await_done(task_id, seconds)


atexit.register(close_all)
