"""When a schedule's occurrences fall: cron expressions (cronsim) and fixed intervals.

Times are integer epoch milliseconds throughout, as everywhere in the protocol.
A cron expression is read in its schedule's time zone, and daylight-saving
changes behave as cronsim documents (it follows Debian's cron): a job at a
fixed local time that falls in a skipped hour runs when the clocks have moved
on, and one that falls in a repeated hour runs once. Intervals are counted
from the Unix epoch, so `every=5 minutes` falls on :00, :05, ... in UTC and
every worker computes the same occurrences.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

__all__ = ["CronSimError", "CronTiming", "IntervalTiming"]


def _to_datetime(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def _to_ms(value: datetime) -> int:
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


class CronTiming:
    """Occurrences of a cron expression (5 fields, or 6 with seconds first) in a time zone."""

    def __init__(self, expression: str, tz: ZoneInfo) -> None:
        self.expression = expression
        self.tz = tz
        # Parse once now, so a bad expression fails where the schedule is read.
        CronSim(expression, datetime.now(tz))

    def _local(self, ms: int) -> datetime:
        return _to_datetime(ms).astimezone(self.tz)

    def next_after(self, ms: int) -> int | None:
        """The first occurrence strictly after `ms`, or None if there is none within 50 years."""
        try:
            return _to_ms(next(CronSim(self.expression, self._local(ms))))
        except StopIteration:
            return None

    def latest_at_or_before(self, ms: int) -> int | None:
        """The last occurrence at or before `ms`, or None."""
        # cronsim iterates backwards from a whole second, strictly before it
        # unless the start has a fraction of a second; start at ms's second
        # plus one microsecond so an occurrence on that very second counts.
        start = self._local(ms - ms % 1000).replace(microsecond=1)
        try:
            return _to_ms(next(CronSim(self.expression, start, reverse=True)))
        except StopIteration:
            return None

    def describe(self) -> str:
        """The expression in English words, as cronsim explains it."""
        try:
            return CronSim(self.expression, datetime.now(UTC)).explain()
        except Exception:  # explain() covers less syntax than the parser does
            return self.expression


class IntervalTiming:
    """Occurrences every `every_ms` milliseconds, counted from the Unix epoch."""

    def __init__(self, every_ms: int) -> None:
        self.every_ms = every_ms

    def next_after(self, ms: int) -> int:
        return (ms // self.every_ms + 1) * self.every_ms

    def latest_at_or_before(self, ms: int) -> int:
        return ms // self.every_ms * self.every_ms

    def describe(self) -> str:
        return f"Every {format_interval(self.every_ms)}"


def format_interval(ms: int) -> str:
    """A duration as its largest exact unit: "5 minutes", "1 day", "1500 ms"."""
    for unit, size in (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000),
                       ("second", 1000)):
        if ms % size == 0:
            count = ms // size
            return f"{count} {unit}" + ("" if count == 1 else "s")
    return f"{ms} ms"
