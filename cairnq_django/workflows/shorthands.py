"""Celery-shaped shorthands over Workflow: chain(), group(), chord().

Each takes signatures, sig(task, payload, **options) tuples or bare task
names, and returns a Workflow to enqueue() (so options such as key= and
concurrency= stay on Workflow).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .builder import Workflow


@dataclass(frozen=True)
class Sig:
    """A step to be: a task, its payload, and enqueue options."""

    task: Any
    payload: Any = None
    options: dict[str, Any] = field(default_factory=dict)


def sig(task: Any, payload: Any = None, **options: Any) -> Sig:
    """A step for chain(), group() or chord(): like Celery's `task.s(...)`."""
    return Sig(task, payload, options)


def _sig(value: Any) -> Sig:
    return value if isinstance(value, Sig) else Sig(value)


def chain(*steps: Any, name: str = "chain", **workflow_options: Any) -> Workflow:
    """Each step after the one before it: step0, step1, ... (ctx.parents["step0"] in step1)."""
    wf = Workflow(name, **workflow_options)
    previous = None
    for index, value in enumerate(steps):
        s = _sig(value)
        previous = wf.add(f"step{index}", s.task, s.payload, after=previous, **s.options)
    return wf


def group(steps: Sequence[Any], *, name: str = "group", **workflow_options: Any) -> Workflow:
    """Steps that run side by side: member0, member1, ..."""
    wf = Workflow(name, **workflow_options)
    for index, value in enumerate(steps):
        s = _sig(value)
        wf.add(f"member{index}", s.task, s.payload, **s.options)
    return wf


def chord(steps: Sequence[Any], callback: Any, *, name: str = "chord", **workflow_options: Any) -> Workflow:
    """A group, then `callback` once every member succeeded (ctx.parents["member0"], ...)."""
    wf = group(steps, name=name, **workflow_options)
    s = _sig(callback)
    wf.add("callback", s.task, s.payload, after=[f"member{i}" for i in range(len(steps))], **s.options)
    return wf
