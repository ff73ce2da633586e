"""A limit from its parts: set_limit's arguments, one CAIRNQ["LIMITS"] entry, the setting as a whole.

Validation only; the Limit value itself (records.py) is what the store and
the worker pass around.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .. import jsoncodec
from ..conf import cairnq_settings
from ..records import MAX_LIMIT_VALUE_LENGTH, Limit
from ..validators import is_integer

# What a limit applies to. A "key_prefix" limit applies to each distinct
# concurrency key starting with its value, apart.
LIMIT_SCOPES = ("queue", "name", "key_prefix")
# A rate limit's period when none is given: one second.
DEFAULT_RATE_PER_MS = 1000
# The 32-bit integer columns of the limits table.
_LIMIT_INT_MAX = 2**31 - 1
_PER_MAX_MS = 2**52


def _positive(argument: str, value: Any, maximum: int) -> int | None:
    if value is None:
        return None
    if is_integer(value) and value <= maximum:
        return value
    raise ValueError(f"{argument} must be a positive integer (at most {maximum}), got {value!r}.")


def check_scope(scope: Any, value: Any) -> None:
    """A known scope and a non-empty string value; ValueError otherwise."""
    if scope not in LIMIT_SCOPES:
        raise ValueError(f"A limit's scope must be one of {', '.join(LIMIT_SCOPES)}; got {scope!r}.")
    if not isinstance(value, str) or not value:
        raise ValueError(f"A {scope} limit needs a non-empty string value, got {value!r}.")


def per_to_ms(per: Any) -> int:
    """A rate limit's period: a timedelta or a number of milliseconds; ValueError otherwise."""
    if isinstance(per, timedelta):
        ms = per // timedelta(milliseconds=1)
        if per <= timedelta(0) or ms < 1:
            raise ValueError(f"per must be at least 1 ms, got {per!r}.")
        return _positive("per", ms, _PER_MAX_MS) or 0
    if isinstance(per, bool) or not isinstance(per, int):
        raise ValueError(f"per must be a timedelta or an integer number of milliseconds, got {per!r}.")
    return _positive("per (ms)", per, _PER_MAX_MS) or 0


def make_limit(
    scope: Any, value: Any, *, concurrency: Any = None, rate: Any = None, per: Any = None,
    source: str = "runtime", allow_lifted: bool = True,
) -> Limit:
    """A validated Limit; ValueError naming what is wrong.

    `per` (a timedelta or ms) only goes with a `rate`; without one, a rate
    counts starts per second.
    """
    check_scope(scope, value)
    if len(value) > MAX_LIMIT_VALUE_LENGTH:
        raise ValueError(
            f"A {scope} limit's value must be at most {MAX_LIMIT_VALUE_LENGTH} characters, "
            f"got {len(value)}."
        )
    try:
        jsoncodec.check_text(value, what=f"{scope} limit's value")
    except ValueError as exc:
        raise ValueError(str(exc)) from None
    concurrency = _positive("concurrency", concurrency, _LIMIT_INT_MAX)
    rate = _positive("rate", rate, _LIMIT_INT_MAX)
    if per is not None and rate is None:
        raise ValueError("per is the period of a rate limit; give a rate with it.")
    per_ms = None if rate is None else (DEFAULT_RATE_PER_MS if per is None else per_to_ms(per))
    if not allow_lifted and concurrency is None and rate is None:
        raise ValueError(f"The {scope} limit on {value!r} needs a concurrency, a rate or both.")
    return Limit(scope, value, concurrency, rate, per_ms, source)


def limit_from_setting(entry: Any) -> Limit:
    """One CAIRNQ["LIMITS"] entry as a Limit; ValueError saying what is wrong with it."""
    if not isinstance(entry, dict):
        raise ValueError(f"Each limit must be a dict, got {type(entry).__name__}: {entry!r}.")
    scopes = [scope for scope in LIMIT_SCOPES if scope in entry]
    if len(scopes) != 1:
        raise ValueError(
            f"A limit names exactly one of {', '.join(map(repr, LIMIT_SCOPES))}; {entry!r} names "
            f"{', '.join(map(repr, scopes)) or 'none'}."
        )
    unknown = sorted(set(entry) - {*LIMIT_SCOPES, "concurrency", "rate", "per"}, key=str)
    if unknown:
        raise ValueError(
            f"Unknown key(s) {', '.join(map(repr, unknown))} in limit {entry!r}; a limit has "
            "queue, name or key_prefix, and concurrency, rate, per."
        )
    scope = scopes[0]
    return make_limit(
        scope, entry[scope], concurrency=entry.get("concurrency"), rate=entry.get("rate"),
        per=entry.get("per"), source="settings", allow_lifted=False,
    )


def settings_limits() -> list[Limit]:
    """CAIRNQ["LIMITS"] as Limits (source "settings"); ValueError for an invalid entry.

    The system checks (checks.py) report invalid entries at start-up with
    their position; this raises on the first one.
    """
    entries = cairnq_settings.raw("LIMITS") or []
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f'CAIRNQ["LIMITS"] must be a list of dicts, got {entries!r}.')
    return [limit_from_setting(entry) for entry in entries]
