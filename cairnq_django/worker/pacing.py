"""How an idle worker paces its database work so a fleet costs what one worker costs.

Two decisions live here, apart from the claim loop that acts on them:

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

import random

# The first deferral after a lost race, its cap, and the jitter spread
# (each deferral is drawn from [d, d * (1 + DEFER_JITTER)]).
DEFER_FIRST_S = 0.02
DEFER_MAX_S = 0.16
DEFER_JITTER = 1.0
# With healthy wakeups a poll runs this many poll intervals apart, +-25 %.
HEALTHY_POLL_FACTOR = 5
POLL_JITTER = 0.25


def jittered(seconds: float, spread: float = POLL_JITTER, rng: random.Random | None = None) -> float:
    """`seconds` moved by up to +-`spread` of itself, at random."""
    draw = (rng or random).uniform(1 - spread, 1 + spread)
    return max(0.0, seconds * draw)


def idle_poll_s(poll_ms: int, healthy_wakeups: bool, rng: random.Random | None = None) -> float:
    """How long an idle worker sleeps before its next poll (a wake ends it sooner)."""
    if not healthy_wakeups:
        return poll_ms / 1000
    return jittered(poll_ms * HEALTHY_POLL_FACTOR / 1000, rng=rng)


class WakePacing:
    """One worker's turn after a wake: at once (it won the last race) or after a deferral."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not secrets
        self._defer_s = 0.0

    @property
    def defers(self) -> bool:
        return self._defer_s > 0

    def deferral_s(self) -> float:
        """How long to wait for a winner's announcement before claiming (0: claim now)."""
        if not self._defer_s:
            return 0.0
        return self._defer_s * self._rng.uniform(1.0, 1.0 + DEFER_JITTER)

    def woken_claim(self, started: int) -> None:
        """Learn from a claim that answered a wake: took something, or lost the race."""
        if started:
            self._defer_s = 0.0
        else:
            self._defer_s = min(DEFER_MAX_S, max(DEFER_FIRST_S, self._defer_s * 2))


# Held back by a flow limit (flow/limits.py): the claim left due tasks queued
# because a concurrency limit was full or a rate window used up. The worker
# then waits this long at most before claiming again (a call of its own
# ending, or the rate window opening, cuts it short), instead of answering
# every wake or change with a claim that the limits answer with nothing. It
# is also how late a slot freed by another worker's task is seen at worst.
HELD_BACK_WAIT_S = 1.0


def held_back_wait_s(retry_in_ms: int | None) -> float:
    """How long to wait after a claim a limit held back: until its rate window opens, at most the bound."""
    if retry_in_ms is None:
        return HELD_BACK_WAIT_S
    return min(HELD_BACK_WAIT_S, max(0.001, retry_in_ms / 1000))
