"""The Wakeup interface, which is also its null object, and the waits its signalling kinds share."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence

# Reconnect backoff for a wakeup's own connection (doubles up to the cap).
RECONNECT_INITIAL_S = 0.1
RECONNECT_MAX_S = 5.0


class Wakeup:
    """Sleep for the whole timeout: what is used where no change signal is available.

    The signalling kinds (PostgresWakeup, SQLiteWakeup) return True from a wait
    when they were woken and False when it timed out; this one always sleeps
    the timeout out and returns False.
    """

    def ready(self, timeout_s: float) -> bool:
        """Start listening and return whether wakes can arrive (False: plain sleeps)."""
        return False

    def wait_for_queued(
        self, queues: Sequence[str], timeout_s: float, due_before: float | None = None
    ) -> bool:
        """Sleep until work may have arrived on one of `queues`, or until the timeout.

        `due_before` (monotonic): also end the wait for work falling due before
        then, for kinds whose change signal cannot tell a delayed task from a
        due one (SQLite): an idle worker then learns of a new, earlier due time
        without polling. PostgreSQL's NOTIFY already wakes for every new
        queued task; here, and there, it is not used.
        """
        sleep(timeout_s)
        return False

    def wait_for_done(self, task_id: str | None, timeout_s: float) -> bool:
        """Sleep until the task (any task for None) may have finished, or until the timeout."""
        sleep(timeout_s)
        return False

    async def await_done(self, task_id: str | None, timeout_s: float) -> bool:
        """Sleep on the event loop like wait_for_done(), without occupying a thread."""
        if timeout_s > 0:
            await asyncio.sleep(timeout_s)
        return False

    def hear_done_on_demand(self) -> None:
        """Listen for finished tasks only from the first wait_for_done() on (a worker's choice)."""

    # ---------------------------------------------------- fleet coordination
    def seek_seat(self, key: str) -> None:
        """An idle worker of configuration `key` asks to hear new tasks (seats.py); here a no-op."""

    def leave_seat(self, key: str) -> None:
        """A worker of `key` whose slots are all taken gives up its wish (one call per seek)."""

    def answers_queued(self, key: str) -> bool:
        """Whether a worker of `key` here is one that answers new work (seated, or no seats).

        A worker that learns when delayed work falls due wakes for it only
        when this says so (runner.py): standbys do not all wake at the same
        instant. Kinds without seats: every worker answers.
        """
        return True

    @property
    def healthy(self) -> bool:
        """Whether wakes are being delivered now, so the caller may poll rarely (see runner)."""
        return False

    @property
    def hears_drained(self) -> bool:
        """Whether this kind hears other workers' "drained" announcements (drained.py)."""
        return False

    def drained_seen(self, key: str) -> int:
        """How many "drained" announcements for `key` were heard so far (a baseline)."""
        return 0

    def peers_announced(self, key: str, worker_id: str) -> bool:
        """Whether a worker other than `worker_id` has announced `key` since this started."""
        return False

    def wait_for_drained(self, key: str, since: int, timeout_s: float) -> bool:
        """Wait until an announcement for `key` after `since` arrives; False at once here."""
        return False

    def close(self) -> None:
        """Release the connection and thread behind this wakeup."""

    @property
    def closed(self) -> bool:
        """Whether close() was called (the registry then builds a new one)."""
        return False

    @property
    def waiting(self) -> int:
        """Return how many threads are inside a wait right now."""
        return 0


def sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


class Waits(Wakeup):
    """Bookkeeping shared by the signalling wakeups: a condition and a waiter count."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting = 0
        self._closed = False
        # Callbacks that wake coroutines waiting on an event loop.
        self._hooks: set[Callable[[], None]] = set()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Mark this wakeup closed and wake every waiter (the kinds then stop their thread)."""
        with self._cond:
            self._closed = True
            self._wake_all()

    def _wake_all(self) -> None:
        """Wake every waiter, threads and coroutines (call with the lock held)."""
        self._cond.notify_all()
        for hook in list(self._hooks):
            hook()

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._waiting

    def _wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
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

    async def _await_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
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
            closed = self._closed
            if not closed:
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
                except TimeoutError:
                    pass
        finally:
            with self._cond:
                self._hooks.discard(poke)
                self._waiting -= 1
