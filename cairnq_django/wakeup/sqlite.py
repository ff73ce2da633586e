"""The SQLite wakeup: a change counter over `PRAGMA data_version`, asleep on inotify when quiet.

data_version changes whenever another connection, in any process on the
host, commits to the file: a cheap cross-process change signal. It is read
on a read-only connection of its own, only while some thread waits. When
nothing has changed for a while the poller blocks on an inotify watch of the
database's directory instead, so an idle worker costs almost nothing and a
commit (which writes the -wal file) wakes it at once (docs/wakeups.md).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import select
import sqlite3
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from ..ids import now_ms
from ..store import sql
from ..store.protocol_statements import LIVE_PROBE, QUEUED_PROBE, draw_values
from .base import RECONNECT_INITIAL_S, RECONNECT_MAX_S, Waits, sleep

logger = logging.getLogger("cairnq_django.wakeup")

# The polling interval starts short after a change (the next one tends to
# follow soon) and doubles to a ceiling while nothing changes.
SQLITE_POLL_MIN_S = 0.001
SQLITE_POLL_MAX_S = 0.005
# With an inotify watch on the file, the poller blocks on it once the
# interval has grown to the maximum; this long sleep only guards against a
# write the watch did not report.
SQLITE_WATCHED_SLEEP_S = 0.5

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
# struct inotify_event: int wd; uint32 mask, cookie, len; char name[len].
_EVENT = struct.Struct("iIII")


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


class FileWatch:
    """Writes to the files of one database (`db`, `db-wal`, `db-journal`), via inotify.

    inotify is reached through ctypes (the standard library has no binding);
    where it is missing (not Linux, no libc symbol, a file system that does not
    report writes) `FileWatch.open` returns None and the poller keeps polling.
    """

    def __init__(self, fd: int, prefix: bytes) -> None:
        self._fd = fd
        self._prefix = prefix
        # interrupt() writes here so a closing wakeup need not wait out a sleep.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._close_lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, db_path: str) -> FileWatch | None:
        """Watch the directory of `db_path`; None where inotify is not available."""
        try:
            libc = _libc()
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "inotify_init1 failed")
            # The directory, not the files: the -wal file comes and goes with
            # the last connection, and a watch on it would go with it.
            directory = os.path.dirname(os.path.abspath(db_path)) or "."
            if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_MODIFY) < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, os.strerror(err))
        except (OSError, AttributeError, TypeError) as exc:
            logger.debug("No inotify for %s (%s); the SQLite wakeup polls.", db_path, exc)
            return None
        return cls(fd, os.fsencode(os.path.basename(db_path)))

    def wait(self, timeout_s: float) -> bool:
        """Return True once one of the database's files was written, False at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self._fd, self._wake_r], [], [], remaining)
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 64)
                except BlockingIOError:
                    pass
                return False
            if ready and self._drain():
                return True

    def interrupt(self) -> None:
        """Make a wait() in progress return now."""
        with self._close_lock:  # never write to a descriptor number reused elsewhere
            if self._closed:
                return
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _drain(self) -> bool:
        """Read every pending event; return whether any concerned the database."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return seen
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, _, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if name.startswith(self._prefix):
                    seen = True

    def close(self) -> None:
        """Close the watch's descriptors; interrupt() is a no-op from now on."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass


class SQLiteWakeup(Waits):
    """Poll `PRAGMA data_version` on a dedicated connection while anyone waits.

    data_version changes whenever another connection (in any process) commits
    to the file, which makes it a cheap cross-process change signal. A change
    is then checked with one read before a queued-waiter is woken.
    """

    def __init__(self, path: str, *, using: str = DEFAULT_DB_ALIAS) -> None:
        super().__init__()
        self._path = path
        self._using = using  # the alias whose rules (and SQL dialect) the checks use
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()
        self._watch: FileWatch | None = None  # once the poller runs, where inotify exists
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
        db.execute(sql.QUERY_ONLY)
        return db

    def _read_version(self) -> int:
        with self._db_lock:
            if self._db is None:
                self._db = self._open()
            return int(self._db.execute(sql.DATA_VERSION).fetchone()[0])

    def ready(self, timeout_s: float = 0.0) -> bool:
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
        self._drop_db()

    def _drop_db(self) -> None:
        """Close the watcher's connection; the next read opens a new one."""
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _poll_forever(self) -> None:
        if not self._path.startswith("file:"):
            self._watch = FileWatch.open(self._path)
        backoff = RECONNECT_INITIAL_S
        interval = SQLITE_POLL_MIN_S
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
                    interval = SQLITE_POLL_MIN_S
                else:
                    interval = min(interval * 2, SQLITE_POLL_MAX_S)
            if self._watch is not None and interval >= SQLITE_POLL_MAX_S:
                # Quiet for a while: sleep until a process writes the file. A
                # commit writes the -wal file a moment before readers can see
                # it, so every wake first polls fast again (from the minimum).
                if self._watch.wait(SQLITE_WATCHED_SLEEP_S):
                    interval = SQLITE_POLL_MIN_S
            else:
                time.sleep(interval)
        if self._watch is not None:
            self._watch.close()
        self._drop_db()

    def _has_queued(self, queues: Sequence[str], due_before: float | None = None) -> bool:
        """Return whether queued work on `queues` is due, or falls due before `due_before` (monotonic).

        True if unsure. The probe's "now" is moved forward: a task due before
        then is claimable at that moment.
        """
        ahead_ms = 0 if due_before is None else max(0, int((due_before - time.monotonic()) * 1000))
        return self._finds(QUEUED_PROBE.bind(
            self._using, draw_values(queues, None), (len(queues),), now=now_ms() + ahead_ms
        ))

    def _is_finished(self, task_id: str) -> bool:
        """Return whether the task is terminal or gone (True if unsure)."""
        return not self._finds(LIVE_PROBE.bind(self._using, {"id": task_id}), unsure=False)

    def _finds(self, probe: tuple[str, Any], unsure: bool = True) -> bool:
        """Whether the probe finds a row, read on the watcher's own connection; `unsure` on errors.

        The probes are the store's own rules (Task.objects.claimable(), .live()),
        compiled for a plain sqlite3 connection.
        """
        text, params = probe
        try:
            with self._db_lock:
                if self._db is None:
                    return unsure
                return self._db.execute(text, params).fetchone() is not None
        except sqlite3.Error:
            return unsure

    def _changed_from(self, seen: int) -> Callable[[], bool]:
        """A predicate for _wait_until/_await_until: a change was counted after `seen`."""
        return lambda: self._changes != seen

    def _wait_for_change(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until a change passes `check`; changes since this thread's last wait count."""
        if not self.ready():
            sleep(timeout_s)
            return False
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            seen = getattr(self._local, "changes", self._changes)
        woken = False
        while self._wait_until(self._changed_from(seen), deadline - time.monotonic()):
            with self._cond:
                seen = self._changes
            if check():
                woken = True
                break
        with self._cond:
            self._local.changes = self._changes
        return woken

    def wait_for_queued(
        self, queues: Sequence[str], timeout_s: float, due_before: float | None = None
    ) -> bool:
        queues = list(queues)
        return self._wait_for_change(
            lambda: not queues or self._has_queued(queues, due_before), timeout_s
        )

    def wait_for_done(self, task_id: str | None, timeout_s: float) -> bool:
        if task_id is None:
            return self._wait_for_change(lambda: True, timeout_s)
        return self._wait_for_change(lambda: self._is_finished(task_id), timeout_s)

    async def await_done(self, task_id: str | None, timeout_s: float) -> bool:
        if not self.ready():
            return await super().await_done(task_id, timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout_s)
        # Coroutines share the loop's thread, so the baseline is this call's
        # entry rather than the thread's previous wait.
        with self._cond:
            seen = self._changes
        while True:
            if not await self._await_until(self._changed_from(seen), deadline - loop.time()):
                return False
            with self._cond:
                seen = self._changes
            # The read runs off the loop: a busy database must not stall it.
            if task_id is None or await asyncio.to_thread(self._is_finished, task_id):
                return True

    def close(self) -> None:
        super().close()
        watch = self._watch
        if watch is not None:
            watch.interrupt()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        self._drop_db()
