"""Claimed tasks whose row this process cannot decode: failed at once, never run.

A foreign writer (or a database that accepts more than Python's decoder does:
jsonb nested past the decoder's depth, SQLite TEXT that is not UTF-8) can leave
a payload nobody here can read. The claim still succeeds, so the rest of the
batch runs; the unreadable task alone ends failed, permanently, with an error
that names the column and the cause.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import error_envelope
from ..records import TaskRecord

logger = logging.getLogger("cairnq_django.worker")

# What a handler is given; an unreadable result or error of an earlier attempt
# does not stop this one.
_HANDLER_COLUMNS = ("payload", "metadata")


def undecodable_envelope(column: str, reason: str) -> dict[str, Any]:
    return error_envelope(
        type="UndecodableTask",
        code=f"undecodable_{column}",
        message=(
            f"The task's {column} cannot be decoded ({reason}); it was failed without "
            "running. Its raw text is on the row."
        ),
        retryable=False,
        details={"column": column, "reason": reason},
    )


def fail_undecodable(
    rows: list[TaskRecord],
    fail: Callable[[TaskRecord, dict[str, Any]], Any],
    report: Callable[..., None],
) -> list[TaskRecord]:
    """Fail every row a handler could not be given; return the others, in order."""
    runnable = []
    for row in rows:
        bad = next(
            ((c, v) for c, v in row.undecodable.items() if c in _HANDLER_COLUMNS), None
        )
        if bad is None:
            runnable.append(row)
            continue
        column, value = bad
        logger.error(
            "Task %s (%s) has a %s that cannot be decoded (%s); failing it without running.",
            row.id, row.name, column, value.reason,
        )
        try:
            fail(row, undecodable_envelope(column, value.reason))
        except Exception as exc:  # its lease runs out and recovery settles it
            report(exc, phase="claim", task=row.name)
    return runnable
