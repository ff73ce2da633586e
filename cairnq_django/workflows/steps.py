"""What every workflow module shares: its error, a step's task name, and a due step's task row.

The bottom of the package: it imports none of the other workflow modules, so
the builder, the release, grafts and control all take these from here.
"""

from __future__ import annotations

from typing import Any

from ..errors import CairnQError
from ..models import WorkflowStep
from ..records import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, DEFAULT_QUEUE, TaskSpec
from ..store import ApplicationOperations
from . import STEP_KEY

# A workflow with concurrency=N caps its steps through a key_prefix flow limit on this prefix + its id.
CONCURRENCY_PREFIX = "cairnq.workflow:"


class InvalidWorkflow(CairnQError, ValueError):
    """Workflow.enqueue() found the graph unusable; nothing was written."""


def task_name(task: Any) -> str:
    """A task's row name: a string, or a django.tasks Task (its cairnq_name or module path)."""
    if isinstance(task, str):
        return task
    name = getattr(task, "cairnq_name", None) or getattr(task, "module_path", None)
    if not isinstance(name, str):
        raise InvalidWorkflow(f"A step's task must be a task name or a django.tasks Task, got {task!r}.")
    return name


def prepare_step(
    store: ApplicationOperations, task: str, payload: Any, options: dict[str, Any], **extra: Any
) -> TaskSpec:
    """A step's task row, prepared from its options as the task row takes them (delay as delay_ms)."""
    return store.prepare(
        task, payload, queue=options.get("queue", DEFAULT_QUEUE),
        priority=options.get("priority", DEFAULT_PRIORITY),
        max_attempts=options.get("max_attempts", DEFAULT_MAX_ATTEMPTS),
        delay_ms=options.get("delay_ms", 0), concurrency_key=options.get("concurrency_key"), **extra,
    )


def task_spec(store: ApplicationOperations, step: WorkflowStep) -> TaskSpec:
    """The task row of a step that is due, prepared (unkeyed: the step's own id makes it unique)."""
    return prepare_step(
        store, step.task_name, step.payload, step.options or {}, correlation_id=step.workflow_id,
        metadata={STEP_KEY: {"workflow": step.workflow_id, "step": step.pk, "name": step.name}},
    )
