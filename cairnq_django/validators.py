"""Checks on the values a task is written with, identical for SQLite and PostgreSQL.

Each refuses before anything is written, with a message naming the argument, so
a value one database would store and the other reject (a NUL, a 64-bit
priority) is refused by both.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeGuard

from .delays import MAX_DELAY_MS
from .jsoncodec import check_text
from .records import CONFLICTS

# The protocol's integer columns (priority, attempt, max_attempts) are 32-bit.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# Text that is part of an index entry. PostgreSQL refuses a B-tree entry over
# about 2,700 bytes, and a name and a queue share the claim index; at 4 bytes a
# character in the worst case, these keep every entry under that on both
# databases rather than failing on one of them at insert time.
MAX_NAME_LENGTH = 255
MAX_QUEUE_LENGTH = 255
MAX_KEY_LENGTH = 512
MAX_CORRELATION_ID_LENGTH = 255


def is_integer(value: Any, *, minimum: int = 1) -> TypeGuard[int]:
    """Is value an int (never a bool) of at least `minimum`? For checks that report, not raise."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def check_integer(argument: str, value: Any, *, minimum: int = 1) -> int:
    """An int (never a bool) of at least `minimum`; returns it. Raises ValueError."""
    if not is_integer(value, minimum=minimum):
        raise ValueError(f"{argument} must be an integer >= {minimum}, got {value!r}.")
    return value


def check_conflict(conflict: Any) -> str:
    """One of the protocol's conflict strategies; returns it. Raises ValueError."""
    if conflict not in CONFLICTS:
        raise ValueError(
            f"Unknown conflict strategy {conflict!r}; use one of {', '.join(CONFLICTS)}."
        )
    return str(conflict)


def cli_integer(minimum: int = 1, *, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse `type=` for an integer option: argparse names the option in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"expected an integer <= {maximum}, got {text!r}")
        return value

    parse.__name__ = "integer" if minimum <= 0 else "positive integer"
    return parse


def cli_database(text: str) -> str:
    """An argparse `type=` for --database: an alias of settings.DATABASES, named in the error."""
    from django.conf import settings

    if text not in settings.DATABASES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not in settings.DATABASES; use one of "
            f"{', '.join(sorted(settings.DATABASES))}"
        )
    return text


def check_label(argument: str, value: Any, max_length: int, *, optional: bool = False) -> None:
    """A name, queue, key or correlation id: a non-empty str of storable characters."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"{argument} must be a non-empty string, got {value!r}.")
    if len(value) > max_length:
        raise ValueError(
            f"{argument} must be at most {max_length} characters, got {len(value)}: "
            f"{value[:40]!r}..."
        )
    try:
        check_text(value, what=argument)
    except ValueError as exc:
        raise ValueError(str(exc)) from None


def check_int32(argument: str, value: Any, *, minimum: int = INT32_MIN) -> None:
    """An integer (not a bool or float) that fits the protocol's 32-bit columns.

    ValueError throughout, type mistakes included, as enqueue() always raised.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{argument} must be an integer, got {value!r}.")
    if not minimum <= value <= INT32_MAX:
        raise ValueError(f"{argument} must be from {minimum} to {INT32_MAX}, got {value!r}.")


def delay_ms(delay: timedelta | int | float | None, run_at: datetime | None, now: datetime) -> int:
    """The delay before a task is due, from enqueue()'s `delay` or `run_at`."""
    if delay is not None and run_at is not None:
        raise ValueError("Pass either delay or run_at, not both.")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise ValueError(f"run_at must be a timezone-aware datetime, got {run_at!r}.")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ValueError("run_at must be a timezone-aware datetime.")
        return _bounded("run_at", max(0.0, (run_at - now).total_seconds() * 1000), run_at)
    if delay is None:
        return 0
    if isinstance(delay, timedelta):
        ms: float = delay.total_seconds() * 1000
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        ms = delay
    else:
        raise ValueError(f"delay must be a timedelta or a number of milliseconds, not {delay!r}.")
    if isinstance(ms, float) and not math.isfinite(ms):
        raise ValueError(f"delay must be a finite number of milliseconds, got {delay!r}.")
    if ms < 0:
        raise ValueError(f"delay must not be negative, got {delay!r}.")
    return _bounded("delay", ms, delay)


def _bounded(argument: str, ms: float, given: Any) -> int:
    if ms > MAX_DELAY_MS:
        raise ValueError(
            f"{argument} is too far in the future ({given!r}); the most is {MAX_DELAY_MS} ms "
            "from now."
        )
    return int(ms)
