"""settings.CAIRNQ['RETENTION']: every problem in it, with a hint, or the rules it means.

read_retention() reads it once, into the rules and the problems. The system
check reports retention_config_errors() (the problems); the sweeper and the
cairnq_sweep command read the setting through parse_retention() (the rules, or
ValueError), so what `manage.py check` accepts is what a sweep deletes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from ..records import STATUSES, TERMINAL_STATUSES
from .rules import RetentionRule

SETTING = "settings.CAIRNQ['RETENTION']"
RULE_KEYS = ("queue", "status", "name", "older_than")

_FORMS_HINT = (
    "Use None to turn retention off, one cutoff for every finished status "
    "(timedelta(days=7) or a number of milliseconds), a {status: cutoff} dict such as "
    "{'succeeded': timedelta(hours=1), 'failed': timedelta(days=30)}, or a list of rule "
    "dicts such as [{'queue': 'emails', 'status': 'succeeded', 'older_than': timedelta(hours=1)}]."
)
_CUTOFF_HINT = (
    "Write a cutoff of zero or more as a timedelta, e.g. timedelta(days=7), or as a "
    "number of milliseconds, e.g. 604800000."
)
_STATUS_HINT = (
    "Use one of 'succeeded', 'failed' or 'canceled'; queued and running tasks are never swept."
)
_RULE_HINT = (
    "A rule is a dict with a required 'older_than' (timedelta or milliseconds) and optional "
    "'queue', 'status' and 'name', e.g. {'queue': 'emails', 'status': 'succeeded', "
    "'older_than': timedelta(hours=1)}."
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_cutoff(value: Any, where: str) -> tuple[int, list[tuple[str, str]]]:
    """A cutoff in milliseconds (0 when it is refused), and its errors."""
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif _is_number(value):
        ms = value
    elif isinstance(value, str):
        return 0, [
            (
                f"{where} is the string {value!r}; a cutoff must be a timedelta or a number "
                "of milliseconds.",
                _CUTOFF_HINT + " Strings like '7d' are accepted only by the cairnq_sweep command.",
            )
        ]
    else:
        return 0, [
            (
                f"{where} must be a timedelta or a number of milliseconds, not "
                f"{type(value).__name__} {value!r}.",
                _CUTOFF_HINT,
            )
        ]
    if not math.isfinite(ms):
        return 0, [(f"{where} is {value!r}, which is not a finite duration.", _CUTOFF_HINT)]
    if ms < 0:
        message = f"{where} is negative ({value!r}); a cutoff cannot be in the future."
        return 0, [(message, _CUTOFF_HINT)]
    return int(ms), []


def _status_errors(status: Any, subject: str) -> list[tuple[str, str]]:
    if status in TERMINAL_STATUSES:
        return []
    if status in STATUSES:
        problem = "which is not a finished status"
    else:
        problem = "which is not a task status"
    return [(f"{subject} {status!r}, {problem}.", _STATUS_HINT)]


def _text_errors(value: Any, where: str, field: str) -> list[tuple[str, str]]:
    if value is None or (isinstance(value, str) and value):
        return []
    return [
        (
            f"{where}[{field!r}] must be a non-empty string, not {value!r}.",
            f"Give the {field} to match as a string, or leave '{field}' out to match "
            f"every {field}.",
        )
    ]


def _read_rule(rule: Any, where: str) -> tuple[RetentionRule, list[tuple[str, str]]]:
    if isinstance(rule, RetentionRule):
        rule = {
            "queue": rule.queue, "status": rule.status, "name": rule.name,
            "older_than": rule.older_than_ms,
        }
    if not isinstance(rule, Mapping):
        message = f"{where} must be a dict, not {type(rule).__name__} {rule!r}."
        return RetentionRule(older_than_ms=0), [(message, _RULE_HINT)]
    errors = []
    for key in sorted(set(rule) - set(RULE_KEYS), key=str):
        errors.append((f"{where} has an unknown key {key!r}.", _RULE_HINT))
    ms = 0
    if "older_than" not in rule:
        errors.append((f"{where} has no 'older_than'.", _RULE_HINT))
    else:
        ms, cutoff_errors = _read_cutoff(rule["older_than"], f"{where}['older_than']")
        errors += cutoff_errors
    if rule.get("status") is not None:
        errors += _status_errors(rule["status"], f"{where}['status'] is")
    errors += _text_errors(rule.get("queue"), where, "queue")
    errors += _text_errors(rule.get("name"), where, "name")
    return RetentionRule(
        older_than_ms=ms, queue=rule.get("queue"), status=rule.get("status"),
        name=rule.get("name"),
    ), errors


def read_retention(
    value: Any, *, label: str = SETTING
) -> tuple[list[RetentionRule], list[tuple[str, str]]]:
    """The rules a retention configuration describes, and (message, hint) pairs for every
    problem in it; the rules mean something only when there is no problem."""
    if value is None:
        return [], []
    if isinstance(value, (timedelta, str)) or _is_number(value):
        ms, errors = _read_cutoff(value, label)
        return [RetentionRule(older_than_ms=ms)], errors
    if isinstance(value, Mapping):
        if not value:
            return [], [
                (
                    f"{label} is an empty dict, which sweeps nothing.",
                    "Name at least one status, e.g. {'succeeded': timedelta(days=7)}, or set "
                    "RETENTION to None to turn retention off.",
                )
            ]
        if any(key in RULE_KEYS for key in value):
            return [], [
                (
                    f"{label} is a single rule dict; rules go in a list.",
                    "Wrap the rule in a list: [{'queue': ..., 'older_than': ...}], or map "
                    "statuses to cutoffs: {'succeeded': timedelta(hours=1)}.",
                )
            ]
        rules, errors = [], []
        for status, cutoff in value.items():
            errors += _status_errors(status, f"{label} has a key")
            ms, cutoff_errors = _read_cutoff(cutoff, f"{label}[{status!r}]")
            errors += cutoff_errors
            rules.append(RetentionRule(older_than_ms=ms, status=status))
        return rules, errors
    if isinstance(value, (list, tuple)):
        if not value:
            return [], [
                (
                    f"{label} is an empty list, which sweeps nothing.",
                    "Give at least one rule, e.g. [{'status': 'succeeded', 'older_than': "
                    "timedelta(days=7)}], or set RETENTION to None to turn retention off.",
                )
            ]
        rules, errors = [], []
        for i, item in enumerate(value):
            rule, rule_errors = _read_rule(item, f"{label}[{i}]")
            rules.append(rule)
            errors += rule_errors
        return rules, errors
    return [], [
        (
            f"{label} must be None, a cutoff, a dict or a list, not {type(value).__name__}.",
            _FORMS_HINT,
        )
    ]


def retention_config_errors(value: Any, *, label: str = SETTING) -> list[tuple[str, str]]:
    """Return (message, hint) pairs for every problem in a retention configuration."""
    return read_retention(value, label=label)[1]


def parse_retention(value: Any, *, label: str = SETTING) -> list[RetentionRule]:
    """Return the rules a retention configuration describes (none when it is None)."""
    rules, errors = read_retention(value, label=label)
    if errors:
        raise ValueError(" ".join(f"{message} {hint}" for message, hint in errors))
    return rules
