"""What the command and the admin show for each schedule: settings merged with its row."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from ..models import ScheduleState, Task
from ..store import get_store
from .config import Schedule, configured_schedules
from .state import read_states

UTC = ZoneInfo("UTC")


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One schedule as it stands: its settings, its row (if it ever ran) and what comes next."""

    name: str
    schedule: Schedule | None  # None: a row whose schedule left settings (stopped)
    state: ScheduleState | None
    next_ms: list[int]
    last_task: Task | None

    @property
    def paused(self) -> bool:
        return bool(self.state and self.state.paused)

    @property
    def tz(self) -> ZoneInfo:
        if self.schedule is not None and self.schedule.timezone:
            return ZoneInfo(self.schedule.timezone)
        return UTC

    def local(self, ms: int | None) -> datetime | None:
        """An instant in the schedule's own time zone (UTC for intervals)."""
        if ms is None:
            return None
        return datetime.fromtimestamp(ms / 1000, self.tz)


def schedule_views(using: str, *, count: int = 1) -> list[ScheduleView]:
    """Every configured schedule, then rows of schedules no longer configured."""
    schedules = configured_schedules()
    states = read_states(using)
    now = get_store(using).clock_ms()
    task_ids = [s.last_task_id for s in states.values() if s.last_task_id]
    tasks = Task.objects.using(using).only("id", "name", "status", "created_at_ms").in_bulk(
        task_ids
    ) if task_ids else {}
    views = []
    for schedule in schedules:
        row = states.get(schedule.name)
        after = max(now, row.cursor_ms) if row is not None else now
        upcoming = [] if row is not None and row.paused else schedule.next_occurrences(
            after, count
        )
        views.append(ScheduleView(
            name=schedule.name, schedule=schedule, state=row, next_ms=upcoming,
            last_task=tasks.get(row.last_task_id) if row and row.last_task_id else None,
        ))
    configured = {s.name for s in schedules}
    for name in sorted(set(states) - configured):
        row = states[name]
        views.append(ScheduleView(
            name=name, schedule=None, state=row, next_ms=[],
            last_task=tasks.get(row.last_task_id) if row.last_task_id else None,
        ))
    return views


def find_schedule(name: str) -> Schedule:
    """The configured schedule called `name`; LookupError naming the others if none is."""
    schedules = configured_schedules()
    for schedule in schedules:
        if schedule.name == name:
            return schedule
    known = ", ".join(s.name for s in schedules) or "none"
    raise LookupError(f"No schedule named {name!r} in settings.CAIRNQ['SCHEDULE'] (known: {known}).")
