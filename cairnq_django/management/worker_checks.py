"""cairnq_worker's system checks: the ones claiming relies on before the first claim, the rest after.

The worker runs the project's system checks, as runserver does, and a
serious issue stops it. Most of what they cost at start-up is in checks about
serving the web: the URL checks import the URLconf and with it every view,
the admin's check its registrations, and `commands` loads the migration
autodetector. Checks whose every tag is in AFTER_FIRST_POLL (and the
untagged ones of UNTAGGED_AFTER_FIRST_POLL) run on the worker's loop right
after its first poll, so the first claim does not wait for them; a serious
issue among them stops the worker (no new claims, running calls finish
within the shutdown timeout) and the command fails with the report
`manage.py check` would print. Everything else runs before anything
is claimed: cairnq_django's own checks of its settings and database options,
the models', caches', templates' and translation's, and every other check
registered without a tag, whose concern nobody declared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.core import checks
from django.core.checks.registry import registry
from django.core.management.base import BaseCommand, SystemCheckError

# Serving requests, the admin and the migration commands: nothing a claim or
# a task handler relies on.
AFTER_FIRST_POLL = frozenset(
    {checks.Tags.urls, checks.Tags.admin, checks.Tags.staticfiles, checks.Tags.security,
     checks.Tags.commands}
)

# Checks Django registers without a tag that are about requests alone: auth's
# of the MIDDLEWARE order (auth.E013), which imports every middleware class.
UNTAGGED_AFTER_FIRST_POLL = frozenset({"django.contrib.auth.checks.check_middleware"})

# (heading, lowest level, level above the highest), in the order `check` prints them.
_GROUPS = (
    ("CRITICALS", checks.CRITICAL, None),
    ("ERRORS", checks.ERROR, checks.CRITICAL),
    ("WARNINGS", checks.WARNING, checks.ERROR),
    ("INFOS", checks.INFO, checks.WARNING),
    ("DEBUGS", None, checks.INFO),
)


def _after_first_poll(check: Callable[..., Any]) -> bool:
    tags = set(getattr(check, "tags", ()))
    if not tags:
        return f"{check.__module__}.{check.__qualname__}" in UNTAGGED_AFTER_FIRST_POLL
    return tags <= AFTER_FIRST_POLL


def run_worker_checks(command: BaseCommand, *, after_first_poll: bool) -> None:
    """Run the checks of one part; raise SystemCheckError for a serious issue, print the rest."""
    issues: list[checks.CheckMessage] = []
    for check in registry.get_checks(include_deployment_checks=False):
        if _after_first_poll(check) == after_first_poll:
            issues.extend(check(app_configs=None, databases=None))
    _report(command, issues)


def _report(command: BaseCommand, issues: Iterable[checks.CheckMessage]) -> None:
    """What BaseCommand.check prints (and raises) for these issues."""
    shown = [issue for issue in issues if not issue.is_silenced()]
    if not shown:
        return
    body = ""
    for heading, lowest, above in _GROUPS:
        group = [
            issue for issue in shown
            if (lowest is None or issue.level >= lowest) and (above is None or issue.level < above)
        ]
        if group:
            lines = sorted(
                command.style.ERROR(str(i)) if i.is_serious() else command.style.WARNING(str(i))
                for i in group
            )
            body += f"\n{heading}:\n" + "\n".join(lines) + "\n"
    header = "System check identified some issues:\n"
    if any(issue.is_serious() for issue in shown):
        raise SystemCheckError(command.style.ERROR(f"SystemCheckError: {header}") + body)
    command.stderr.write(header + body, lambda text: text)
