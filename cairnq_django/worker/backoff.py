"""Retry delay: exponential backoff with equal jitter."""

from __future__ import annotations

import random
from collections.abc import Callable


def retry_delay_ms(
    attempt: int,
    *,
    base_ms: int,
    cap_ms: int,
    rand: Callable[[], float] = random.random,
) -> int:
    """Return the delay before retrying after failed attempt number `attempt`.

    The window doubles per attempt up to `cap_ms` and the delay falls uniformly
    in its upper half, [w/2, w): the floor keeps the backoff meaningful, the
    jitter stops a fleet whose calls all failed together from retrying in step.
    A base of 0 disables backoff.
    """
    if base_ms <= 0 or cap_ms <= 0:
        return 0
    window = min(cap_ms, base_ms << max(0, attempt - 1))  # base x 2^(attempt-1)
    floor = window // 2
    return floor + int(rand() * (window - floor))
