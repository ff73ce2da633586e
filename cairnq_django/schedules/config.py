"""settings.CAIRNQ['SCHEDULE']: each named schedule read into a Schedule, or refused.

    CAIRNQ = {
        "SCHEDULE": {
            "nightly-report": {"task": "reports.build", "cron": "0 3 * * *",
                               "timezone": "Europe/Paris", "payload": {"kind": "daily"}},
            "poll-feeds": {"task": "feeds.poll", "every": timedelta(minutes=5)},
        },
    }

The system check (checks.py) reads the setting through `read_schedule` (the
schedules and every fault), the scheduler through `parse_schedule` (the same
read, raising its first fault), so what `manage.py check` accepts is what the
worker runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings as django_settings

from .. import jsoncodec
from ..conf import cairnq_settings
from ..records import DEFAULT_CONFLICT, MAX_SCHEDULE_NAME_LENGTH
from ..validators import (
    INT32_MIN,
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_QUEUE_LENGTH,
    check_conflict,
    check_int32,
    check_label,
)
from .timing import CronSimError, CronTiming, IntervalTiming

SETTING = "settings.CAIRNQ['SCHEDULE']"

# What to do with occurrences that came due while no scheduler was running.
MISSED_POLICIES = ("run-once", "skip")

# How late an occurrence may be found and still count as on time (run on its
# own), rather than missed (left to the `missed` policy).
DEFAULT_GRACE_MS = 10_000

KNOWN_KEYS = (
    "task", "cron", "every", "timezone", "payload", "args", "kwargs", "queue", "priority",
    "max_attempts", "metadata", "key", "conflict", "missed", "grace",
)

class ScheduleConfigError(ValueError):
    """A schedule in settings that cannot run; `hint` says what would."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """One configured schedule: when it fires and what it enqueues."""

    name: str
    task: str
    timing: CronTiming | IntervalTiming = field(compare=False)
    cron: str | None = None
    every_ms: int | None = None
    timezone: str | None = None
    payload: Any = None
    # None: what the task's handler declares where it is registered, else the
    # protocol's default, as for any enqueue by name (declared.py).
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    key: str | None = None
    conflict: str = DEFAULT_CONFLICT
    missed: str = "run-once"
    grace_ms: int = DEFAULT_GRACE_MS

    @property
    def expression(self) -> str:
        """The cron expression, or "every <interval>"."""
        if self.cron is not None:
            return self.cron
        return "every " + self.timing.describe().removeprefix("Every ")

    def describe(self) -> str:
        """When it runs, in words."""
        text = self.timing.describe()
        if self.cron is not None and self.timezone:
            text += f" ({self.timezone})"
        return text

    def next_after(self, ms: int) -> int | None:
        return self.timing.next_after(ms)

    def next_occurrences(self, after_ms: int, count: int) -> list[int]:
        found: list[int] = []
        at = after_ms
        while len(found) < count:
            nxt = self.timing.next_after(at)
            if nxt is None:
                break
            found.append(nxt)
            at = nxt
        return found

    def plan(self, cursor_ms: int, now_ms: int) -> Plan:
        """What is due at `now_ms` for a schedule done up to `cursor_ms`.

        Occurrences due within the grace are on time: each is enqueued. Older
        ones were missed: under "run-once" the latest of them is enqueued
        unless an on-time one is due anyway; under "skip" none is. Never a
        burst of every missed occurrence.
        """
        first = self.timing.next_after(cursor_ms)
        if first is None or first > now_ms:
            return Plan(run=(), advance_to=cursor_ms, missed=False, next_ms=first)
        latest = max(self.timing.latest_at_or_before(now_ms) or first, first)
        on_time_from = now_ms - self.grace_ms
        missed = first < on_time_from
        run: list[int] = []
        # The first on-time occurrence, found without walking a long outage.
        at = first if not missed else self.timing.next_after(on_time_from - 1)
        while at is not None and at <= latest:
            run.append(at)
            at = self.timing.next_after(at)
        if not run and self.missed == "run-once":
            run.append(latest)
        return Plan(
            run=tuple(run), advance_to=latest, missed=missed,
            next_ms=self.timing.next_after(latest),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The occurrences to enqueue now, in order, and where the cursor ends up."""

    run: tuple[int, ...]
    advance_to: int
    # Were occurrences older than the grace found (left to the `missed` policy)?
    missed: bool
    next_ms: int | None


def parse_schedule(value: Any) -> list[Schedule]:
    """Read the SCHEDULE setting into Schedules; raise ScheduleConfigError on the first fault."""
    schedules, errors = read_schedule(value)
    if errors:
        raise errors[0]
    return schedules


def read_schedule(value: Any) -> tuple[list[Schedule], list[ScheduleConfigError]]:
    """The schedules that parse, and the faults of those that do not."""
    schedules: list[Schedule] = []
    errors: list[ScheduleConfigError] = []
    if value is None:
        return schedules, errors
    if not isinstance(value, dict):
        error = ScheduleConfigError(
            f"{SETTING} must be a dict of schedule name to schedule, not "
            f"{type(value).__name__}.",
            hint='For example {"poll-feeds": {"task": "feeds.poll", "every": '
            "timedelta(minutes=5)}}.",
        )
        return schedules, [error]
    for name, spec in value.items():
        try:
            schedules.append(_parse_one(name, spec))
        except ScheduleConfigError as exc:
            errors.append(exc)
    return schedules, errors


def configured_schedules() -> list[Schedule]:
    """The schedules in settings, read now (settings may be overridden in tests)."""
    return parse_schedule(cairnq_settings.raw("SCHEDULE"))


def _parse_one(name: Any, spec: Any) -> Schedule:
    if not isinstance(name, str) or not name or len(name) > MAX_SCHEDULE_NAME_LENGTH:
        raise ScheduleConfigError(
            f"{SETTING} has a schedule named {name!r}; a name must be a non-empty string of "
            f"at most {MAX_SCHEDULE_NAME_LENGTH} characters."
        )
    where = f"{SETTING}[{name!r}]"
    if not isinstance(spec, dict):
        raise ScheduleConfigError(f"{where} must be a dict, not {type(spec).__name__}.")
    unknown = sorted(set(spec) - set(KNOWN_KEYS), key=str)
    if unknown:
        raise ScheduleConfigError(
            f"{where} has unknown key(s): {', '.join(map(repr, unknown))}.",
            hint="Known keys: " + ", ".join(KNOWN_KEYS) + ".",
        )
    if "task" not in spec:
        raise ScheduleConfigError(
            f"{where} has no 'task'.", hint="Name the task to enqueue, e.g. 'reports.build'."
        )
    task = spec["task"]
    _check(where, "task", check_label, "task", task, MAX_NAME_LENGTH)
    has_cron, has_every = "cron" in spec, "every" in spec
    if has_cron == has_every:
        raise ScheduleConfigError(
            f"{where} needs exactly one of 'cron' and 'every'.",
            hint="'cron': '0 3 * * *' (a cron expression), or 'every': timedelta(minutes=5).",
        )
    options: dict[str, Any] = {}
    timing: CronTiming | IntervalTiming
    if has_cron:
        timing, tz_name = _cron(where, spec["cron"], spec.get("timezone"))
        options.update(cron=spec["cron"], timezone=tz_name)
    else:
        if "timezone" in spec:
            raise ScheduleConfigError(
                f"{where} has a 'timezone' but no 'cron'; an 'every' interval does not "
                "depend on the time zone.",
                hint="Remove 'timezone', or use a cron expression.",
            )
        every_ms = _duration(where, "every", spec["every"], minimum=1000)
        timing = IntervalTiming(every_ms)
        options["every_ms"] = every_ms
    if "args" in spec or "kwargs" in spec:
        # A Tasks framework @task (named by its module path): its rows carry
        # {"args": [...], "kwargs": {...}}, which the worker unpacks.
        if "payload" in spec:
            raise ScheduleConfigError(
                f"{where} has both 'payload' and 'args'/'kwargs'.",
                hint="Use 'payload' for a CairnQ handler, 'args'/'kwargs' for a framework "
                "@task.",
            )
        args, kwargs = spec.get("args", []), spec.get("kwargs", {})
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
            raise ScheduleConfigError(
                f"{where}: 'args' must be a list and 'kwargs' a dict, not "
                f"{type(args).__name__} and {type(kwargs).__name__}."
            )
        spec = {**spec, "payload": {"args": list(args), "kwargs": dict(kwargs)}}
    if "payload" in spec:
        try:
            jsoncodec.dumps(spec["payload"], what="payload")
        except Exception as exc:
            raise ScheduleConfigError(f"{where}['payload'] is not JSON: {exc}") from None
        options["payload"] = spec["payload"]
    if "metadata" in spec:
        metadata = spec["metadata"]
        if not isinstance(metadata, dict):
            raise ScheduleConfigError(f"{where}['metadata'] must be a dict.")
        try:
            jsoncodec.dumps(metadata, what="metadata")
        except Exception as exc:
            raise ScheduleConfigError(f"{where}['metadata'] is not JSON: {exc}") from None
        options["metadata"] = dict(metadata)
    if "queue" in spec:
        _check(where, "queue", check_label, "queue", spec["queue"], MAX_QUEUE_LENGTH)
        options["queue"] = spec["queue"]
    if "key" in spec and spec["key"] is not None:
        _check(where, "key", check_label, "key", spec["key"], MAX_KEY_LENGTH)
        options["key"] = spec["key"]
    for option, minimum in (("priority", INT32_MIN), ("max_attempts", 1)):
        if option in spec:
            _check(where, option, check_int32, option, spec[option], minimum=minimum)
            options[option] = spec[option]
    if "conflict" in spec:
        options["conflict"] = _check(where, "conflict", check_conflict, spec["conflict"])
    if "missed" in spec:
        if spec["missed"] not in MISSED_POLICIES:
            raise ScheduleConfigError(
                f"{where}['missed'] is {spec['missed']!r}.",
                hint="Use 'run-once' (run the latest missed occurrence once when a worker "
                "returns; the default) or 'skip'.",
            )
        options["missed"] = spec["missed"]
    if "grace" in spec:
        options["grace_ms"] = _duration(where, "grace", spec["grace"], minimum=0)
    return Schedule(name=name, task=task, timing=timing, **options)


def _check(where: str, option: str, check: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """check(*args, **kwargs), a validators check; its ValueError names spec[option]."""
    try:
        return check(*args, **kwargs)
    except ValueError as exc:
        raise ScheduleConfigError(f"{where}['{option}']: {exc}") from None


def _duration(where: str, option: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, timedelta):
        ms = int(value.total_seconds() * 1000)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise ScheduleConfigError(
            f"{where}['{option}'] must be a timedelta or a number of milliseconds, not "
            f"{value!r}."
        )
    if ms < minimum:
        raise ScheduleConfigError(
            f"{where}['{option}'] is {ms} ms; the least is {minimum} ms."
        )
    return ms


def _cron(where: str, expression: Any, tz_name: Any) -> tuple[CronTiming, str]:
    if tz_name is None:
        tz_name = getattr(django_settings, "TIME_ZONE", None) or "UTC"
    if not isinstance(tz_name, str):
        raise ScheduleConfigError(f"{where}['timezone'] must be a string, not {tz_name!r}.")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleConfigError(
            f"{where}['timezone'] is {tz_name!r}, which is not a known time zone.",
            hint="Use an IANA name such as 'UTC' or 'Europe/Paris' (zoneinfo; on systems "
            "without time zone data, install the tzdata package).",
        ) from None
    if not isinstance(expression, str) or not expression.strip():
        raise ScheduleConfigError(f"{where}['cron'] must be a cron expression string.")
    try:
        timing = CronTiming(expression, tz)
    except CronSimError as exc:
        raise ScheduleConfigError(
            f"{where}['cron'] = {expression!r} is not a valid cron expression: {exc}",
            hint="Five fields, minute hour day-of-month month day-of-week (e.g. '0 3 * * *'), "
            "or six with seconds first.",
        ) from None
    return timing, tz_name
