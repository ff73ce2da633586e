"""Durations, progress, tables and errors as a person reads them, in the admin and the commands.

Pure functions of a value, with no admin or HTML in them, so code outside the
admin shows the same "3 min 5 s" and the same percent as its pages.
"""

from __future__ import annotations

import math


def human_duration(ms: int | None) -> str:
    """Render milliseconds for a reader, in spaced units: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min.

    Not retention's compact spelling ("3m5s"), which reads back as a setting.
    """
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, whole_seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {whole_seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def valid_progress(progress: float | None) -> float | None:
    """The progress if it is a number from 0 to 1, else None.

    The store writes only such numbers, but another SDK or a direct write can
    leave NaN, ±Infinity or any other float in the column, and none of those
    is a percent (nor, for NaN and Infinity, JSON).
    """
    if progress is None or not math.isfinite(progress) or not 0.0 <= progress <= 1.0:
        return None
    return progress


def progress_percent(progress: float | None) -> int | None:
    """The progress as a whole percent, or None when there is none or it is invalid."""
    fraction = valid_progress(progress)
    return None if fraction is None else round(fraction * 100)


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The header and rows as left-aligned columns two spaces apart, one string per line."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
