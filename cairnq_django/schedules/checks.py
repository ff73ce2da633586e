"""System checks for settings.CAIRNQ['SCHEDULE'] (cairnq.E030-E031)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register

from .config import SETTING, parse_schedule, schedule_config_errors


@register(Tags.compatibility)
def check_schedule(app_configs=None, **kwargs):
    user = getattr(settings, "CAIRNQ", None)
    if not isinstance(user, dict) or user.get("SCHEDULE") is None:
        return []
    value = user["SCHEDULE"]
    errors = [
        Error(str(error), hint=error.hint, id="cairnq.E030")
        for error in schedule_config_errors(value)
    ]
    if errors:
        return errors
    return _unknown_task_errors(parse_schedule(value))


def _unknown_task_errors(schedules):
    """Schedules naming a task no handler in this project is registered for."""
    from ..worker.registry import autodiscover, registry

    autodiscover()
    known = set(registry.handlers)
    if not known:
        return []  # nothing registered here: the handlers may all live in peers
    return [
        Error(
            f"{SETTING}[{schedule.name!r}] enqueues task {schedule.task!r}, but no handler "
            "is registered under that name.",
            hint="Registered task names: " + ", ".join(sorted(known)) + ". If a worker of "
            "another CairnQ implementation runs it, silence this check with "
            "SILENCED_SYSTEM_CHECKS = ['cairnq.E031'].",
            id="cairnq.E031",
        )
        for schedule in schedules
        if schedule.task not in known
    ]
