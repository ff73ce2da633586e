"""The row options a task's handler declares, applied however the task is enqueued.

`@task("charge_card", max_attempts=2)` registers the handler (worker/registry.py),
which declares its queue, max_attempts and priority here. An enqueue by name
(`cairnq_django.enqueue("charge_card", ...)`, enqueue_many(), ctx.submit())
then resolves each option it was not given: the caller's value, else the
declared one, else the protocol's default. Only a process that registered the
handler (imported its tasks module) knows what it declares; elsewhere the
protocol's defaults apply.

Options read when the task runs (its retry backoff, its concurrency) need no
resolving: the worker that runs it reads them from its own registration.

The table lives below the client and the worker, which is why the registry
writes to it rather than the client reading the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .records import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE


@dataclass(frozen=True, slots=True)
class RowOptions:
    """The options a task row is written with."""

    queue: str
    max_attempts: int
    priority: int


_PROTOCOL_DEFAULTS = RowOptions(DEFAULT_QUEUE, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY)

# Task name -> what its handler declares, None where it declares nothing.
_declared: dict[str, dict[str, Any]] = {}


def declare(
    name: str,
    *,
    queue: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
) -> None:
    """Record what the handler of `name` declares (the registry calls this)."""
    _declared[name] = {"queue": queue, "max_attempts": max_attempts, "priority": priority}


def forget(name: str) -> None:
    """Drop what `name` declared (its handler was unregistered)."""
    _declared.pop(name, None)


def row_options(
    name: str,
    *,
    queue: str | None = None,
    max_attempts: int | None = None,
    priority: int | None = None,
) -> RowOptions:
    """Each option as given, else as `name`'s handler declares it, else the protocol default."""
    found = _declared.get(name, {})
    chosen: dict[str, Any] = {
        option: found.get(option) if value is None else value
        for option, value in (("queue", queue), ("max_attempts", max_attempts), ("priority", priority))
    }
    return replace(_PROTOCOL_DEFAULTS, **{k: v for k, v in chosen.items() if v is not None})
