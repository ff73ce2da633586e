"""The framework Task with CairnQ's extras, and the tasks this process knows.

A framework task travels as a CairnQ row named after the task: its module
path (the framework's identity for a task), or the short `cairnq_name` it was
given so that workers in other languages can run or enqueue it. Its payload is
`{"args": [...], "kwargs": {...}}`.

Every task built against a CairnQ backend is validated by it when it is
created, at import time of its module; that is when it becomes known here. A
row is only ever matched against these known tasks: nothing named by a row is
imported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .. import compat
from ..records import DEFAULT_CONFLICT, MAX_LIMIT_VALUE_LENGTH
from ..validators import (
    MAX_KEY_LENGTH,
    MAX_NAME_LENGTH,
    check_conflict,
    check_integer,
    check_label,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CairnQTask(compat.Task):
    """A framework Task that may also carry CairnQ options.

    On Django 6.1 and the backport `@task(cairnq_name=..., max_attempts=...)`
    sets them; on every version `.using(...)` does.
    """

    # The row's name instead of the module path: a name other languages share.
    cairnq_name: str | None = None
    # Attempts before the task fails for good; None takes OPTIONS["MAX_ATTEMPTS"].
    max_attempts: int | None = None
    # A business key and what to do when it is taken (see cairnq_django.enqueue).
    key: str | None = None
    conflict: str = DEFAULT_CONFLICT
    # Under the key_prefix flow limits its prefix matches (see cairnq_django.enqueue).
    concurrency_key: str | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: Any = None,
        backend: str | None = None,
        cairnq_name: str | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        conflict: str | None = None,
        concurrency_key: str | None = None,
    ) -> CairnQTask:
        """Create a new Task with modified defaults (and CairnQ options)."""
        changes: dict[str, Any] = {
            name: value
            for name, value in (
                ("priority", priority), ("queue_name", queue_name), ("run_after", run_after),
                ("backend", backend), ("cairnq_name", cairnq_name),
                ("max_attempts", max_attempts), ("key", key), ("conflict", conflict),
                ("concurrency_key", concurrency_key),
            )
            if value is not None
        }
        return replace(self, **changes)


def row_name(task: Any) -> str:
    """The name a task's rows carry."""
    name: str = getattr(task, "cairnq_name", None) or task.module_path
    return name


def validate_extras(task: Any) -> None:
    """Raise InvalidTask if the task's CairnQ options cannot be stored."""
    try:
        check_label("Task name", row_name(task), MAX_NAME_LENGTH)
        check_label("key", getattr(task, "key", None), MAX_KEY_LENGTH, optional=True)
        check_label(
            "concurrency_key", getattr(task, "concurrency_key", None), MAX_LIMIT_VALUE_LENGTH,
            optional=True,
        )
        max_attempts = getattr(task, "max_attempts", None)
        if max_attempts is not None:
            check_integer("max_attempts", max_attempts)
        check_conflict(getattr(task, "conflict", DEFAULT_CONFLICT))
    except ValueError as exc:
        raise compat.InvalidTask(str(exc)) from None


# Row name -> the Task it runs, for every task validated in this process.
known_tasks: dict[str, Any] = {}


def remember(task: Any) -> None:
    """Remember a task under its row name; refuse a name taken by another function."""
    name = row_name(task)
    # The first Task seen is the definition; later ones are .using() copies
    # of it, with per-call options. dict.setdefault is atomic, so two threads
    # validating at once agree on which came first.
    known = known_tasks.setdefault(name, task)
    if known.module_path != task.module_path:
        raise compat.InvalidTask(
            f"Task name {name!r} is already used by {known.module_path}; "
            f"{task.module_path} needs another cairnq_name."
        )
