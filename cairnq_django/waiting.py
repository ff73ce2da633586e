"""wait()/call(): poll a task's status until it finishes, with growing intervals."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from django.db import connections

from .conf import cairnq_settings
from .errors import CairnQError, TaskCanceled, TaskFailed, TaskTimeout
from .records import TaskRecord, TaskStatus

# A hook for a push channel (Postgres LISTEN cairnq_done): called with
# (alias, task_id_or_None, seconds) in place of a plain sleep. Polling stays
# the source of truth; a wake only shortens the sleep.
_sleeper: Callable[[str, str | None, float], None] | None = None


# The same for await_task()/acall(), awaited on the event loop.
_async_sleeper: Callable[[str, str | None, float], Awaitable[None]] | None = None


def set_done_sleeper(
    sleeper: Callable[[str, str | None, float], None] | None,
    async_sleeper: Callable[[str, str | None, float], Awaitable[None]] | None = None,
) -> None:
    """Install the sleeps between two probes (None: plain time/asyncio sleeps)."""
    global _sleeper, _async_sleeper
    _sleeper = sleeper
    _async_sleeper = async_sleeper


def _refuse_inside_transaction(using: str) -> None:
    if connections[using].in_atomic_block:
        raise CairnQError(
            f"wait()/call() was called inside an open transaction on database {using!r}. "
            "A worker cannot see a task this transaction has not committed, and a wait "
            "here would also hold the transaction open. Call it after the transaction "
            "commits (for example from transaction.on_commit)."
        )


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
    """One wait's state: the probe, the growing interval and the deadline."""

    def __init__(self, store, task_id, key, timeout, poll_initial_ms, poll_max_ms, raise_on_failure):
        self.store, self.task_id, self.key = store, task_id, key
        self.raise_on_failure = raise_on_failure
        # Floored at 1 ms: a zero interval would never grow and spin on the database.
        self.interval = max(1, poll_initial_ms or cairnq_settings.WAIT_POLL_INITIAL) / 1000
        self.ceiling = max(1, poll_max_ms or cairnq_settings.WAIT_POLL_MAX) / 1000
        self.started = time.monotonic()
        self.deadline = None if timeout is None else self.started + timeout
        self.probed_id = task_id

    def check(self) -> TaskRecord | None:
        """Probe once: the final row, None to keep waiting, or raise."""
        store, key = self.store, self.key
        probe: TaskStatus | None = (
            store.get_status(self.task_id) if key is None else store.get_status_by_key(key)
        )
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
            snapshot = store.get(self.task_id) if key is None else store.get_by_key(key)
            raise TaskTimeout(
                _explain(snapshot, now - self.started, key),
                task_id=snapshot.id if snapshot else self.task_id,
                key=key,
                snapshot=snapshot,
            )
        return None

    def next_sleep(self) -> float:
        """Seconds to sleep before the next probe; grows the interval for the one after."""
        sleep_for = self.interval
        if self.deadline is not None:
            sleep_for = max(0.0, min(sleep_for, self.deadline - time.monotonic()))
        self.interval = min(self.interval * 1.5, self.ceiling)
        return sleep_for


def wait(
    store,
    *,
    task_id: str | None = None,
    key: str | None = None,
    timeout: float | None = None,
    poll_initial_ms: int | None = None,
    poll_max_ms: int | None = None,
    raise_on_failure: bool = True,
) -> TaskRecord:
    """Block until the task reaches a terminal status and return its final row."""
    _refuse_inside_transaction(store.using)
    poll = _Poll(store, task_id, key, timeout, poll_initial_ms, poll_max_ms, raise_on_failure)
    while True:
        task = poll.check()
        if task is not None:
            return task
        sleep_for = poll.next_sleep()
        if _sleeper is not None:
            _sleeper(store.using, poll.probed_id, sleep_for)
        else:
            time.sleep(sleep_for)


async def await_(
    store,
    *,
    task_id: str | None = None,
    key: str | None = None,
    timeout: float | None = None,
    poll_initial_ms: int | None = None,
    poll_max_ms: int | None = None,
    raise_on_failure: bool = True,
) -> TaskRecord:
    """The async twin of wait(): probes on Django's thread, sleeps on the event loop.

    Sleeping with asyncio rather than in a worker thread keeps a long wait from
    occupying a thread, and keeps every query on the thread-sensitive executor
    whose connection Django closes (a connection opened in an arbitrary pool
    thread would stay open for the life of the process).
    """
    from asgiref.sync import sync_to_async

    await sync_to_async(_refuse_inside_transaction)(store.using)
    poll = _Poll(store, task_id, key, timeout, poll_initial_ms, poll_max_ms, raise_on_failure)
    check = sync_to_async(poll.check)
    while True:
        task = await check()
        if task is not None:
            return task
        sleep_for = poll.next_sleep()
        if _async_sleeper is not None:
            await _async_sleeper(store.using, poll.probed_id, sleep_for)
        else:
            await asyncio.sleep(sleep_for)
