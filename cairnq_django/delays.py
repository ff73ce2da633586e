"""How far ahead a task may be due, and a snooze's delay checked against it.

A leaf module: errors.Snooze checks its delay when it is raised, and
errors.py is imported by nearly everything else.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

# A run time must stay an exact integer for every peer, JavaScript's Number
# included (2**53); 2**52 ms from now is about 140,000 years.
MAX_DELAY_MS = 2**52


def snooze_delay_ms(delay: Any) -> int:
    """A snooze's delay (seconds, or a timedelta) in whole ms: positive, finite, at most MAX_DELAY_MS.

    Rounded up, so a positive delay never becomes "due now" and a snooze
    loop always yields to other work. Raises ValueError.
    """
    if isinstance(delay, timedelta):
        seconds: float = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = delay
    else:
        raise ValueError(f"A snooze delay must be a number of seconds or a timedelta, not {delay!r}.")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"A snooze delay must be a positive, finite number of seconds, got {delay!r}.")
    ms = math.ceil(seconds * 1000)
    if ms > MAX_DELAY_MS:
        raise ValueError(
            f"A snooze delay is too long ({delay!r}); the most is {MAX_DELAY_MS} ms."
        )
    return ms
