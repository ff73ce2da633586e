"""Durations written as text: '30s', '7d', '1h30m' read into milliseconds, and back.

The command-line options (cairnq_sweep --older-than, cairnq_health --max-age)
read this form; rule descriptions and the sweep loop's banner write it.
"""

from __future__ import annotations

import argparse
import re

_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> int:
    """Return milliseconds for '1500', '30s', '30m', '2h', '7d', '1w' or '1h30m'."""
    value = str(text).strip().lower().replace(" ", "")
    if value.isdigit():
        return int(value)
    pos, total = 0, 0.0
    for match in _PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if not value or pos != len(value):
        raise ValueError(
            f"{text!r} is not a duration; write a number of milliseconds or a number with "
            "a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d."
        )
    return int(total)


def cli_duration(text: str) -> int:
    """An argparse `type=` for a duration option: argparse names the option in its error."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_compact_duration(ms: int) -> str:
    """Milliseconds in the compact unit form parse_duration() reads back, e.g. '1d12h', '3m5s'."""
    if ms == 0:
        return "0s"
    parts: list[str] = []
    rest = ms
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS_MS[unit]
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)
