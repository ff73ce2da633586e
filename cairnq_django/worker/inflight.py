"""The calls a worker has handed out and not yet released, counted per name.

The claim loop reads it to size the next claim, the heartbeat to know which
leases to renew, the watchdog to find calls past max-run; handler threads
change it as their calls return and are released. `changed` is set on every
change, so the loop can wait for a slot instead of polling.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

from .context import TaskContext
from .execution import Call

# Enough for every call a busy worker releases during any gap a heartbeat could
# report, without growing with the worker's lifetime.
_RELEASED_KEPT = 4096


class InFlight:
    """Thread-safe bookkeeping of the calls in flight."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, Call] = {}
        self._by_name: dict[str, int] = defaultdict(int)
        self.changed = threading.Event()
        #: Tasks handed to handlers since the worker started.
        self.tasks_started = 0
        # Recently released calls with when they were released: a late heartbeat
        # must also name the tasks that finished while it could not run, since
        # their leases went unrenewed all the same.
        self._released: deque[tuple[float, Call]] = deque(maxlen=_RELEASED_KEPT)
        # When the earliest task this worker put back in the queue with a delay
        # (a retry's backoff, a snooze) falls due (monotonic): the idle loop
        # wakes for it without asking the database (runner.py, _idle).
        self._requeued_due: float | None = None

    def __len__(self) -> int:
        # No lock: a signal handler asks this, and must not wait for a lock
        # the code it interrupted may hold.
        return len(self._calls)

    def add(self, call: Call) -> None:
        with self._lock:
            self._calls[id(call)] = call
            self._by_name[call.name] += 1
            self.tasks_started += len(call.contexts)

    def returned(self, call: Call) -> None:
        """The handler is done (its tasks may still be settling): its slot is free."""
        call.returned = True
        self.changed.set()

    def release(self, call: Call) -> None:
        """The call is over, its tasks settled or given up; release it once."""
        with self._lock:
            if call.released:
                return
            call.released = True
            self._calls.pop(id(call), None)
            self._by_name[call.name] -= 1
            now = time.monotonic()
            self._released.append((now, call))
            for ctx in call.contexts:
                delay_ms = requeue_delay_ms(ctx)
                if delay_ms is not None:
                    due = now + delay_ms / 1000
                    if self._requeued_due is None or due < self._requeued_due:
                        self._requeued_due = due
        self.changed.set()

    def take_requeued_due(self) -> float | None:
        """The earliest due time (monotonic) of this worker's own delayed requeues, once."""
        with self._lock:
            due, self._requeued_due = self._requeued_due, None
        return due

    def counts(self) -> tuple[int, int]:
        """(calls in flight, of which handlers still running)."""
        with self._lock:
            return len(self._calls), sum(not c.returned for c in self._calls.values())

    def calls_by_name(self) -> dict[str, int]:
        with self._lock:
            return dict(self._by_name)

    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls.values())

    def contexts(self) -> list[TaskContext]:
        return [ctx for call in self.calls() for ctx in call.contexts]

    def contexts_since(self, since: float) -> list[TaskContext]:
        """Every task in flight at some moment after `since` (monotonic)."""
        with self._lock:
            calls = list(self._calls.values())
            calls += [call for at, call in self._released if at >= since]
        return [ctx for call in calls for ctx in call.contexts]

    def lease_expired_by(self, task_id: str) -> float | None:
        """When the lease of in-flight task `task_id` has certainly expired (monotonic), if known."""
        for ctx in self.contexts():
            if ctx.task_id == task_id:
                return ctx.settlement.lease_expired_by()
        return None

    def overdue(self, now: float) -> list[Call]:
        """Calls whose handler still runs past its deadline (monotonic `now`)."""
        return [
            c for c in self.calls()
            if c.deadline is not None and now >= c.deadline and not c.returned
        ]


def requeue_delay_ms(ctx: TaskContext) -> int | None:
    """The delay of the retry or snooze that put this task back in the queue, if one did."""
    settlement = ctx.settlement
    final = settlement.final
    if final is None or final.status != "queued":
        return None
    return settlement.snoozed_ms if settlement.snoozed_ms is not None else settlement.retry_ms
