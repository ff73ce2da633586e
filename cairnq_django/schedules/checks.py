"""System checks for settings.CAIRNQ['SCHEDULE'] (cairnq.E030-E031)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register

from .config import SETTING, Schedule, read_schedule


@register(Tags.compatibility)
def check_schedule(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    user = getattr(settings, "CAIRNQ", None)
    if not isinstance(user, dict) or user.get("SCHEDULE") is None:
        return []
    schedules, faults = read_schedule(user["SCHEDULE"])
    errors = [Error(str(fault), hint=fault.hint, id="cairnq.E030") for fault in faults]
    return errors + _unknown_task_errors(schedules)


def _unknown_task_errors(schedules: list[Schedule]) -> list[CheckMessage]:
    """Schedules naming a task no handler in this project is registered for."""
    if not schedules:
        return []
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
