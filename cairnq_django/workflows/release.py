"""The count-down: run inside the transaction that settles a parent, so a child is released exactly once.

Every statement here runs in the caller's transaction: the one whose write
moved the parent's task row to a terminal status (the worker's settle, or the
sweeper's backstop for a step another SDK's worker finished). The parent's
own step row is locked first, then its children's rows in id order
(`select_for_update`; on SQLite the write transaction already excludes every
other writer). Each child's `pending` goes down by one under that lock, so
when many parents finish at once exactly one transaction sees it reach zero
and inserts the child's task row. A failed or canceled parent cancels its
`when="succeeded"` children, and theirs, in the same transaction, and counts
down its `when="finished"` children as a success would.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import F

from ..flow.limits import clear_limit
from ..records import TERMINAL_STATUSES, TaskRecord, TaskSpec
from ..store import ApplicationOperations
from . import STEP_KEY
from .models import Workflow, WorkflowEdge, WorkflowStep

# A workflow with concurrency=N caps its steps through a key_prefix flow limit on this prefix + its id.
CONCURRENCY_PREFIX = "cairnq.workflow:"


def step_marker(row: TaskRecord) -> dict[str, Any] | None:
    """The workflow marker of a task row's metadata, or None for a plain task."""
    marker = row.metadata.get(STEP_KEY) if isinstance(row.metadata, dict) else None
    return marker if isinstance(marker, dict) and "step" in marker else None


def after_settle(
    store: ApplicationOperations, row: TaskRecord, grafts: Sequence[dict[str, Any]] = ()
) -> None:
    """Release what `row`'s end lets run; call inside the transaction that settled it.

    Does nothing for a plain task, a row not yet terminal (a retry, a
    snooze), or a step already settled (by the backstop, or retried away).
    `grafts` are steps the handler added (ctx.workflow.add): written first,
    and only if the step succeeded.
    """
    marker = step_marker(row)
    if marker is None or row.status not in TERMINAL_STATUSES:
        return
    steps = WorkflowStep.objects.using(store.using)
    step = steps.select_for_update().filter(
        pk=marker["step"], task_id=row.id, state="released"
    ).first()
    if step is None:
        return
    if grafts and row.status == "succeeded":
        from .grafting import write_grafts  # a graft is rare; its module loads when used

        write_grafts(store, step, grafts)
    finish(store, step.workflow_id, [(step, row.status)])


def finish(store: ApplicationOperations, workflow_id: str, ended: Iterable[tuple[WorkflowStep, str]]) -> None:
    """Record steps' ends, count down (or cancel) their children, release those now due."""
    using = store.using
    steps = WorkflowStep.objects.using(using)
    frontier = list(ended)
    closed = unsuccessful = 0
    due: list[WorkflowStep] = []
    while frontier:
        outcome: dict[str, str] = {}
        for step, status in frontier:
            steps.filter(pk=step.pk).update(state=status)
            outcome[step.pk] = status
            closed += 1
            unsuccessful += status != "succeeded"
        parents_of: dict[str, list[str]] = defaultdict(list)
        edges = WorkflowEdge.objects.using(using).filter(parent_id__in=list(outcome))
        for parent_id, child_id in edges.values_list("parent_id", "child_id"):
            parents_of[child_id].append(parent_id)
        frontier = []
        if not parents_of:
            break
        # Locked in id order: two parents finishing at once lock shared children in the same order.
        children = steps.select_for_update().filter(
            pk__in=sorted(parents_of), state="waiting"
        ).order_by("pk")
        for child in children:
            ended_parents = [outcome[p] for p in parents_of[child.pk]]
            if child.when == "succeeded" and any(s != "succeeded" for s in ended_parents):
                frontier.append((child, "canceled"))
                continue
            steps.filter(pk=child.pk).update(pending=F("pending") - len(ended_parents))
            child.pending -= len(ended_parents)
            if child.pending <= 0:
                due.append(child)
    release(store, due)
    _count_down_workflow(store, workflow_id, closed, unsuccessful)


def release(store: ApplicationOperations, due: Sequence[WorkflowStep]) -> None:
    """Insert the task rows of steps whose parents are all done, and mark them released."""
    if not due:
        return
    from .builder import task_spec  # builder imports this module

    specs: list[TaskSpec] = []
    keys: list[tuple[str | None, str]] = []
    for step in due:
        spec, key = task_spec(store, step)
        specs.append(spec)
        keys.append(key)
    tasks = store.submit_many(specs, keys=keys)
    steps = WorkflowStep.objects.using(store.using)
    for step, task in zip(due, tasks, strict=True):
        step.task_id, step.state, step.pending = task.id, "released", 0
        steps.filter(pk=step.pk).update(task_id=task.id, state="released", pending=0)


def _count_down_workflow(
    store: ApplicationOperations, workflow_id: str, closed: int, unsuccessful: int
) -> None:
    """Lower the workflow's open count (its row locked last); end it when nothing is open."""
    if not closed:
        return
    runs = Workflow.objects.using(store.using)
    runs.filter(pk=workflow_id).update(
        steps_open=F("steps_open") - closed,
        steps_unsuccessful=F("steps_unsuccessful") + unsuccessful,
    )
    run = runs.get(pk=workflow_id)
    if run.steps_open > 0 or run.state != "running":
        return
    run.state = (
        "canceled" if run.cancel_requested
        else "failed" if run.steps_unsuccessful else "succeeded"
    )
    run.finished_at_ms = store.clock_ms()
    run.save(update_fields=["state", "finished_at_ms"])
    if run.concurrency is not None:
        clear_limit("key_prefix", CONCURRENCY_PREFIX + run.id, using=store.using)
