"""Block until a SQLite database's files are written, through Linux inotify.

The SQLite wakeup's poller sleeps on this between reads of `PRAGMA
data_version` instead of waking every few milliseconds: an idle worker then
costs almost nothing, and a commit from any process on the host (which
writes the -wal file, or the database file in rollback-journal mode) wakes
it at once. inotify is reached through ctypes because the standard library
has no binding; where it is missing (not Linux, no libc symbol, a file system
that does not report writes) `FileWatch.open` returns None and the poller
keeps its short sleeps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import struct
import threading
import time

logger = logging.getLogger("cairnq_django.wakeup")

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
# struct inotify_event: int wd; uint32 mask, cookie, len; char name[len].
_EVENT = struct.Struct("iIII")


def _libc():
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True)
    libc.inotify_init1.argtypes = [ctypes.c_int]
    libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    return libc


class FileWatch:
    """Writes to the files of one database (`db`, `db-wal`, `db-journal`), via inotify."""

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
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass
