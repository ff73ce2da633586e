"""When an idle worker should next claim for delayed work falling due (docs/wakeups.md).

A delayed task, a retry's backoff and a snooze announce themselves when they
are written, not when they fall due, so the worker keeps the moment itself:
what its idle probe read (the earliest queued, not yet due task of its
queues and names), and the earliest of its own requeues, which it knows when
the call ends. The claim loop (runner.py) sleeps until the earlier of the two.
"""

from __future__ import annotations

# run_at is whole milliseconds of the queue's clock: a claim a hair early
# would find the task not yet due.
DUE_MARGIN_S = 0.001
# Two moments this close are one (a requeue of the worker's own, and the
# probe's reading of the same task).
SAME_DUE_S = 0.05


class DueTimes:
    """The next due moments (monotonic) one worker knows of."""

    def __init__(self) -> None:
        # From the last idle probe; None: nothing queued is waiting to fall due.
        self.read_at: float | None = None
        # The earliest of this worker's own delayed requeues not answered yet.
        self.own_at: float | None = None

    def read(self, due_in_ms: int | None, sent: float, received: float) -> None:
        """What a probe sent at `sent` and answered at `received` said (milliseconds from its now)."""
        if due_in_ms is None:
            self.read_at = None
            return
        # The database read its clock about halfway through the round trip.
        self.read_at = (sent + received) / 2 + due_in_ms / 1000 + DUE_MARGIN_S

    def requeued(self, at: float | None) -> None:
        """One of the worker's own calls put a task back in the queue, due at `at`."""
        if at is not None and (self.own_at is None or at < self.own_at):
            self.own_at = at

    def next(self, *, answers: bool) -> float | None:
        """The moment to claim at. A read one counts only for a worker that `answers` new work.

        Standbys learn the moment too, at their polls; all waking at that
        instant would be the herd listening seats removed (wakeup/seats.py).
        Its own requeues count for any worker: only it knows them without asking.
        """
        moments = [] if self.own_at is None else [self.own_at]
        if answers and self.read_at is not None:
            moments.append(self.read_at)
        return min(moments) if moments else None

    def spend(self, now: float) -> bool:
        """A claim answers the moments up to `now`; whether one of the worker's own was among them."""
        own = self.own_at is not None and self.own_at <= now
        # A requeue of its own the probe also read is answered by the same claim.
        if self.own_at is not None and self.own_at <= now + SAME_DUE_S:
            self.own_at = None
        if self.read_at is not None and self.read_at <= now:
            self.read_at = None
        return own
