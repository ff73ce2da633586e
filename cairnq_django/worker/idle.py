"""IdlePolicy: when the claim loop looks again, and how it waits until then.

The loop (runner.py) claims, dispatches and asks this object what to do
next. It keeps what one poll tells the next (work is likely, the claim
answers a wake or a due time, work was left behind, a limit held tasks back)
and the waits between polls: for a slot when the worker is full, after a
claim a limit held back, the idle sleep on the wakeup (cut short by a wake,
a due time or a call that ended), the deferral after a wake, the listening
seat (wakeup/seats.py), and the reconnect backoff.

Two of its decisions pace an idle worker's database work so a fleet costs
what one worker costs:

- Who answers a wake. Every seated worker (wakeup/seats.py: two per
  configuration by default, every worker with CAIRNQ["LISTENERS"] = None)
  hears every `cairnq_queued` notification. A worker whose last woken
  claim took something claims at
  once; one whose woken claim found nothing (another worker was faster)
  defers: it waits a short, jittered, growing moment for the winner's
  "drained" announcement (drained.py) and claims only if none comes. It
  defers only once it has heard another worker announce: alone, a lost race
  was to its own earlier claim. So one task costs about one claim
  however many workers sleep, and work that outlasts one claim (no
  announcement: the winner filled its slots) still reaches the deferring
  workers within the deferral.
- How often an idle worker polls. With healthy wakeups a poll only catches
  what no notification announces (a delay or retry falling due, an expired
  lease), so it runs POLL_INTERVAL x HEALTHY_POLL_FACTOR apart, with jitter
  so a fleet started together does not poll together.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

from ..drained import drained_key
from ..pooling import release
from ..store.leases import LeaseOperations
from ..wakeup import Wakeup, get_wakeup
from .due import DueTimes
from .inflight import InFlight

logger = logging.getLogger("cairnq_django.worker")

# Reconnect backoff after the loop's own database work fails. Kept short:
# after a network outage a pause is most of the time it takes to claim again
# (a connect into a dead path already waits connect_timeout).
_DB_RETRY_FIRST_S = 0.25
_DB_RETRY_MAX_S = 2.0
# Upper bound on any single wait of the loop, so stop() is noticed promptly.
SLICE_S = 0.2
# A task due this little before an idle sleep's end is left to that end.
_DUE_EARLY_WAKE_S = 0.005
# The first deferral after a lost race, its cap, and the jitter spread
# (each deferral is drawn from [d, d * (1 + DEFER_JITTER)]).
DEFER_FIRST_S = 0.02
DEFER_MAX_S = 0.16
DEFER_JITTER = 1.0
# With healthy wakeups a poll runs this many poll intervals apart, +-25 %.
HEALTHY_POLL_FACTOR = 5
POLL_JITTER = 0.25
# Held back by a flow limit (flow/limits.py): the claim left due tasks queued
# because a concurrency limit was full or a rate window used up. The worker
# then waits this long at most before claiming again (a call of its own
# ending, or the rate window opening, cuts it short), instead of answering
# every wake or change with a claim that the limits answer with nothing. It
# is also how late a slot freed by another worker's task is seen at worst.
HELD_BACK_WAIT_S = 1.0


def idle_poll_s(poll_ms: int, healthy_wakeups: bool, rng: random.Random | None = None) -> float:
    """How long an idle worker sleeps before its next poll (a wake ends it sooner)."""
    if not healthy_wakeups:
        return poll_ms / 1000
    draw = (rng or random).uniform(1 - POLL_JITTER, 1 + POLL_JITTER)
    return max(0.0, poll_ms * HEALTHY_POLL_FACTOR / 1000 * draw)


@dataclass(frozen=True)
class PollTurn:
    """What the waits before a poll said about it."""

    #: Work is likely: the claim skips the read-only probe.
    likely: bool
    #: The claim answers a wake (end_poll learns from its outcome).
    woken: bool
    #: The claim answers a due time (the next one is learnt after it).
    due_wake: bool


class IdlePolicy:
    """One worker's idle policy: the flags a poll leaves and the waits between polls."""

    def __init__(
        self,
        *,
        worker_id: str,
        store: LeaseOperations,
        queues: Sequence[str],
        names: Sequence[str],
        poll_ms: int,
        burst: bool,
        in_flight: InFlight,
        stopping: Callable[[], bool],
        refresh_presence: Callable[[], None],
        report: Callable[..., None],
    ) -> None:
        self._worker_id = worker_id
        self._store = store
        self._using = store.using
        self._queues = queues
        self._names = names
        # Whom this worker's "drained" announcements concern (drained.py).
        self.drained_key = drained_key(queues, names)
        self._poll_ms = poll_ms
        self._burst = burst
        self._in_flight = in_flight
        self._changed = in_flight.changed
        self._stopping = stopping
        self._refresh_presence = refresh_presence
        self._report = report
        # The alias's wakeup from start() on; before that, or once it fails,
        # sleeps that only a call of this worker ending cuts short.
        self.wakeup: Wakeup = _EventWait(self._changed)
        self._seeking_seat = False
        self.work_likely = False
        # Whether the next claim answers a wake, and this worker's turn after
        # one: at once (0: it won the last race) or after a deferral of about
        # `_defer_s`. The fleet's answer to one NOTIFY is about one claim.
        self.woken = False
        self._defer_s = 0.0
        self._rng = random.Random()  # noqa: S311 - jitter, not secrets
        # Whether the last poll may have left claimable work behind (it filled
        # its slots, or a name's limit kept it from drawing): only then is a
        # call ending a reason to look again before a wake says so.
        self.left_work = False
        # When delayed work falls due (due.py): an idle worker sleeps until
        # then rather than until its next rare poll. `due_wake`: the next
        # claim answers such a moment.
        self.due = DueTimes()
        self.due_wake = False
        # How long to hold off after a claim flow limits held back
        # (held_back; None: they did not).
        self.held_wait_s: float | None = None
        self._retry_s = _DB_RETRY_FIRST_S

    def start(self) -> None:
        try:
            self.wakeup = get_wakeup(self._using)
            # Only a handler that waits for another task needs finishes heard.
            self.wakeup.hear_done_on_demand()
        except Exception as exc:
            self._report(exc, phase="wakeup")

    def close(self) -> None:
        with suppress(Exception):
            self.seek_seat(False)
            self.wakeup.close()

    # ------------------------------------------------------------ one poll
    def begin_poll(self) -> PollTurn | None:
        """Take what the waits said about this poll; None if the probe finds nothing claimable.

        The read-only probe keeps idle polls off the write path. Right after a
        claim that got all it asked for, or a wakeup, work is likely, and the
        claim itself answers the same question one round trip sooner.
        """
        turn = PollTurn(likely=self.work_likely, woken=self.woken, due_wake=self.due_wake)
        self.work_likely = self.woken = self.due_wake = self.left_work = False
        self.held_wait_s = None
        if not turn.likely and not self._probe():
            return None
        return turn

    def _probe(self) -> bool:
        """The read-only probe: is anything claimable? It also notes when the next task falls due."""
        sent = time.monotonic()
        probe = self._store.probe_idle(queues=self._queues, names=self._names)
        self.due.read(probe.due_in_ms, sent, time.monotonic())
        return probe.work

    def announces(self, turn: PollTurn) -> bool:
        """Whether a claim covering every name of this poll tells the fleet it drained them."""
        return turn.woken and self.wakeup.hears_drained

    def held_back(self, retry_in_ms: int | None) -> None:
        """A claim of this poll left due tasks to a flow limit.

        Wait until its rate window opens, at most HELD_BACK_WAIT_S.
        """
        wait_s = HELD_BACK_WAIT_S
        if retry_in_ms is not None:
            wait_s = min(HELD_BACK_WAIT_S, max(0.001, retry_in_ms / 1000))
        self.held_wait_s = wait_s if self.held_wait_s is None else min(self.held_wait_s, wait_s)

    def end_poll(self, turn: PollTurn, started: int, *, filled: bool, pending: bool) -> None:
        """Note the poll's outcome: calls started, a draw filled, names not drawn."""
        self.work_likely = filled
        self.left_work = filled or pending or self.held_wait_s is not None
        if turn.woken:
            # A woken claim that took something claims at once next time; one
            # that lost the race defers, longer each time in a row.
            self._defer_s = 0.0 if started else min(DEFER_MAX_S, max(DEFER_FIRST_S, self._defer_s * 2))
        if (turn.due_wake or turn.likely and not started) and not self.left_work:
            # The due time just answered is spent, or a claim that skipped the
            # probe found nothing (a wake may have announced a delayed task):
            # learn the next due time now, before sleeping (one read, only
            # after such claims).
            self.work_likely = self._probe()

    # ------------------------------------------------------------ what next
    def full(self) -> None:
        """No slot is free: wait for a call to end (a full worker cannot answer a wake)."""
        self.seek_seat(False)
        self.wait_for_change(self._poll_ms / 1000)

    def claim_failed(self) -> None:
        """The poll's database work failed: wait, longer each time in a row, before the next."""
        logger.warning(
            "Claiming failed; retrying in %.2fs (the database may be restarting).", self._retry_s
        )
        deadline = time.monotonic() + self._retry_s
        while not self._stopping() and time.monotonic() < deadline:
            time.sleep(min(SLICE_S, max(0.0, deadline - time.monotonic())))
        self._retry_s = min(_DB_RETRY_MAX_S, self._retry_s * 2)

    def rest(self, started: int, busy: int) -> bool:
        """After a poll that succeeded, wait as its outcome says; False once burst mode finds nothing left.

        `busy` is the calls in flight before the poll.
        """
        self._retry_s = _DB_RETRY_FIRST_S
        held_s = self.held_wait_s
        if started and (self.work_likely or self._burst):
            return True
        if self._burst:
            # `busy` was read before the probe: a call that ended after
            # the probe may have queued a retry or children, so only an
            # empty probe with nothing in flight before it means drained.
            # Tasks a limit holds back are not drained: they wait their turn.
            if not busy and held_s is None:
                return False
            # A running call may still enqueue children or retries.
            self.wait_for_change(self._poll_ms / 1000 if held_s is None else held_s)
        elif held_s is not None:
            self.held_wait(held_s)
        elif started or not self.work_likely:
            # A claim that took all the work that was due: asking again at
            # once would find nothing and, worse, hold the GIL while the
            # handler threads just handed work are trying to start; the
            # wakeup (or the poll interval) says when to look again. (After
            # an empty claim, work_likely means the probe found work come due.)
            self.idle()
        return True

    # ------------------------------------------------------------ waits
    def wait_for_change(self, timeout_s: float, *, released_only: bool = False) -> None:
        """Wait for a change in the calls in flight (`released_only`: for one to be released)."""
        release(self._using)
        in_flight = len(self._in_flight)
        deadline = time.monotonic() + timeout_s
        while not self._stopping():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._changed.wait(min(remaining, SLICE_S)):
                if not released_only:
                    return
                self._changed.clear()
                if len(self._in_flight) < in_flight:
                    return

    def held_wait(self, seconds: float) -> None:
        """After a claim a limit held back: wait for a call of this worker to settle, or `seconds`.

        Every wake would find the same tasks held, so the wakeups are not
        heard meanwhile (new work waits at most HELD_BACK_WAIT_S, or a call's
        end). A call that merely returned frees no slot in the database until
        its completion commits, so only a settled call ends the wait; `seconds`
        is until the rate window opens, or the bound. The held tasks were due:
        the next claim skips the probe, so an opening window is used at once
        (a start's lateness delays its slot's reuse by as much).
        """
        self._refresh_presence()
        self.wait_for_change(seconds, released_only=True)
        self.work_likely = True

    def idle(self) -> None:
        """Sleep a poll interval on the wakeup, cut short by a wake, a due time or a call that ended."""
        release(self._using)  # a pooled connection is not held while idle
        self.seek_seat(True)
        deadline = time.monotonic() + idle_poll_s(self._poll_ms, self.wakeup.healthy, self._rng)
        while not self._stopping():
            now = time.monotonic()
            remaining = deadline - now
            # When to claim for delayed work falling due (monotonic), if ever.
            self.due.requeued(self._in_flight.take_requeued_due())
            due = self.due.next(answers=self.wakeup.answers_queued(self.drained_key))
            if due is not None and due <= now:
                # The next claim answers a due time: it skips the probe, and
                # learns the next one after.
                own = self.due.spend(now)
                logger.debug(
                    "Idle worker %s woke for %s falling due.", self._worker_id,
                    "its own retry or snooze" if own else "a delayed task it read",
                )
                self.due_wake = self.work_likely = True
                return
            # A call that ended may have freed a slot for work the last poll
            # left behind. If that poll took everything, what the call enqueued
            # (a retry, children) sends its own NOTIFY, so with healthy wakeups
            # a probe per finished task would find nothing.
            call_ended = self._changed.is_set() and (self.left_work or not self.wakeup.healthy)
            if remaining <= 0 or call_ended:
                if remaining <= 0:
                    logger.debug("Idle worker %s polls: its poll interval ran out.", self._worker_id)
                return
            step = min(remaining, SLICE_S, *(() if due is None else (due - now,)))
            # Where the signal cannot tell delayed work from due work (SQLite), a
            # new task falling due before this sleep ends wakes it too.
            due_before = (deadline if due is None else min(deadline, due)) - _DUE_EARLY_WAKE_S
            # The workers-table row is refreshed from here too: a healthy
            # wakeup's poll interval can be longer than its report interval.
            self._refresh_presence()
            try:
                if self.wakeup.wait_for_queued(self._queues, step, due_before):
                    # Only an announcement heard after the wake counts: notifications
                    # arrive in commit order, so one heard before it is from a claim
                    # that committed before this task did.
                    if self._stand_down(self.wakeup.drained_seen(self.drained_key)):
                        continue
                    self.work_likely = self.woken = True
                    return
            except Exception as exc:
                self._report(exc, phase="wakeup")
                self.wakeup = _EventWait(self._changed)  # plain polling from now on

    def _stand_down(self, drained_before: int) -> bool:
        """After a wake: whether a faster worker took all the work while this one deferred."""
        deferral = self._deferral_s()
        if deferral <= 0 or not self.wakeup.hears_drained:
            return False
        # Alone on these queues and names, a lost race was to this worker's own
        # earlier claim (two enqueues, one claim): nobody would announce.
        if not self.wakeup.peers_announced(self.drained_key, self._worker_id):
            return False
        return self.wakeup.wait_for_drained(self.drained_key, drained_before, deferral)

    def _deferral_s(self) -> float:
        """How long to wait for a winner's announcement before claiming (0: claim now)."""
        return self._defer_s * self._rng.uniform(1.0, 1.0 + DEFER_JITTER)

    def seek_seat(self, seeking: bool) -> None:
        """Tell the wakeup whether this worker wants to hear new tasks (wakeup/seats.py)."""
        if seeking != self._seeking_seat:
            self._seeking_seat = seeking
            wakeup = self.wakeup
            (wakeup.seek_seat if seeking else wakeup.leave_seat)(self.drained_key)


class _EventWait(Wakeup):
    """After the wakeup failed: plain sleeps, cut short when a call of this worker ends."""

    def __init__(self, changed: threading.Event) -> None:
        self._changed = changed

    def wait_for_queued(
        self, queues: Sequence[str], timeout_s: float, due_before: float | None = None
    ) -> bool:
        self._changed.wait(timeout_s)
        return False

