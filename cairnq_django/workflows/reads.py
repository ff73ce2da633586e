"""Reading workflows: get_workflow(), wait_workflow(), and a step's parents' results (ctx.parents)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import Count

from ..errors import CairnQError
from ..models import Task, Workflow, WorkflowEdge, WorkflowStep
from ..models.workflows import WORKFLOW_STATES
from ..store import get_store

TERMINAL = frozenset({"succeeded", "failed", "canceled"})


class WorkflowTimeout(CairnQError, TimeoutError):
    """wait_workflow() gave up; the workflow keeps running."""

    def __init__(self, workflow_id: str, state: str, timeout: float) -> None:
        super().__init__(f"Workflow {workflow_id} is still {state} after {timeout:g} s.")
        self.workflow_id = workflow_id
        self.state = state


@dataclass(frozen=True)
class StepState:
    """One step as get_workflow() shows it: the task's status once it is a task."""

    name: str
    group: str
    index: int | None
    task_name: str
    when: str
    state: str  # waiting, queued, running, succeeded, failed or canceled
    task_id: str | None
    result: Any
    error: Any


@dataclass(frozen=True)
class WorkflowRun:
    """A workflow as last read: its state, its steps, and how far it has got."""

    id: str
    name: str
    key: str | None
    state: str
    steps: tuple[StepState, ...]
    steps_total: int
    steps_open: int
    created_at_ms: int
    finished_at_ms: int | None
    using: str

    @property
    def progress(self) -> float:
        """The share of steps that have ended (0..1)."""
        return 1.0 if not self.steps_total else 1 - self.steps_open / self.steps_total

    @property
    def is_finished(self) -> bool:
        return self.state in TERMINAL

    def step(self, name: str) -> StepState:
        return next(s for s in self.steps if s.name == name)

    @classmethod
    def load(cls, workflow_id: str, *, using: str | None = None) -> WorkflowRun:
        alias = get_store(using).using
        run = Workflow.objects.using(alias).get(pk=workflow_id)
        steps = list(
            WorkflowStep.objects.using(alias).filter(workflow_id=workflow_id).order_by("position", "pk")
        )
        tasks = _task_rows(alias, [s.task_id for s in steps if s.task_id])
        return cls(
            id=run.id, name=run.name, key=run.key, state=run.state,
            steps=tuple(_step_state(s, tasks.get(s.task_id or "")) for s in steps),
            steps_total=run.steps_total, steps_open=run.steps_open,
            created_at_ms=run.created_at_ms, finished_at_ms=run.finished_at_ms, using=alias,
        )

    def refresh(self) -> WorkflowRun:
        return WorkflowRun.load(self.id, using=self.using)

    def cancel(self, *, by: str = "") -> int:
        """Cancel every step not yet ended; see control.cancel_workflow()."""
        from .control import cancel_workflow

        return cancel_workflow(self.id, using=self.using)

    def retry(self, mode: str = "failed_only") -> int:
        """Run steps of a finished workflow again; see control.retry_workflow()."""
        from .control import retry_workflow

        return retry_workflow(self.id, mode=mode, using=self.using)


def _task_rows(using: str, task_ids: list[str]) -> dict[str, Mapping[str, Any]]:
    """The status, result and error of each task, by id, read 500 ids at a time."""
    return {
        row["id"]: row
        for start in range(0, len(task_ids), 500)
        for row in Task.objects.using(using).filter(id__in=task_ids[start:start + 500])
        .values("id", "status", "result", "error")
    }


def _state(using: str, workflow_id: str) -> str:
    return Workflow.objects.using(using).values_list("state", flat=True).get(pk=workflow_id)


def _step_state(step: WorkflowStep, task: Mapping[str, Any] | None) -> StepState:
    state = step.state
    if step.state == "released" and task is not None:
        state = task["status"]
    elif step.state == "released":
        state = "queued"  # a task row purged before the sweeper's backstop saw it end
    return StepState(
        name=step.name, group=step.group, index=step.index, task_name=step.task_name,
        when=step.when, state=state, task_id=step.task_id,
        result=task["result"] if task else None, error=task["error"] if task else None,
    )


def count_by_state(*, using: str | None = None) -> dict[str, int]:
    """How many workflows are in each state, every state present (cairnq_status, the dashboard)."""
    alias = get_store(using).using
    counts = dict.fromkeys(WORKFLOW_STATES, 0)
    rows = Workflow.objects.using(alias).order_by().values_list("state").annotate(n=Count("*"))
    for state, n in rows:
        counts[state] = int(n)
    return counts


def get_workflow(workflow_id: str, *, using: str | None = None) -> WorkflowRun:
    """Return a workflow with its steps' states and results; Workflow.DoesNotExist if unknown."""
    return WorkflowRun.load(workflow_id, using=using)


async def aget_workflow(workflow_id: str, *, using: str | None = None) -> WorkflowRun:
    """See get_workflow()."""
    return await sync_to_async(get_workflow)(workflow_id, using=using)


def wait_workflow(
    workflow_id: str, *, timeout: float | None = None, using: str | None = None
) -> WorkflowRun:
    """Block until the workflow has ended (WorkflowTimeout after `timeout` seconds); return it."""
    alias = get_store(using).using
    deadline = None if timeout is None else time.monotonic() + timeout
    interval = 0.1
    while True:
        state = _state(alias, workflow_id)
        if state in TERMINAL:
            return WorkflowRun.load(workflow_id, using=alias)
        if deadline is not None and time.monotonic() >= deadline:
            raise WorkflowTimeout(workflow_id, state, timeout or 0)
        pause = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
        time.sleep(pause)
        interval = min(0.5, interval * 1.5)


async def await_workflow(
    workflow_id: str, *, timeout: float | None = None, using: str | None = None
) -> WorkflowRun:
    """See wait_workflow()."""
    alias = get_store(using).using
    deadline = None if timeout is None else time.monotonic() + timeout
    interval = 0.1
    while True:
        state = await sync_to_async(_state)(alias, workflow_id)
        if state in TERMINAL:
            return await aget_workflow(workflow_id, using=alias)
        if deadline is not None and time.monotonic() >= deadline:
            raise WorkflowTimeout(workflow_id, state, timeout or 0)
        await asyncio.sleep(interval)
        interval = min(0.5, interval * 1.5)


class Parents(Mapping[str, Any]):
    """ctx.parents: each parent group's result; a map()'s as a list in map order.

    For a `when="finished"` step each value is an outcome envelope instead:
    {"status": ..., "result": ..., "error": ...}.
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getitem__(self, group: str) -> Any:
        return self._values[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<Parents {sorted(self._values)}>"


def parent_results(step_id: str, *, using: str) -> Parents:
    """The results of a step's parents, read once when the handler first asks."""
    step = WorkflowStep.objects.using(using).only("when").get(pk=step_id)
    parent_ids = WorkflowEdge.objects.using(using).filter(child_id=step_id).values_list("parent_id")
    parents = list(
        WorkflowStep.objects.using(using).filter(pk__in=parent_ids)
        .order_by("group", "index", "pk").values("group", "index", "task_id", "state")
    )
    tasks = _task_rows(using, [p["task_id"] for p in parents if p["task_id"]])
    values: dict[str, Any] = {}
    for parent in parents:
        task = tasks.get(parent["task_id"] or "")
        if step.when == "finished":
            value: Any = {
                "status": task["status"] if task else parent["state"],
                "result": task["result"] if task else None,
                "error": task["error"] if task else None,
            }
        else:
            value = task["result"] if task else None
        if parent["index"] is None:
            values[parent["group"]] = value
        else:
            values.setdefault(parent["group"], []).append(value)
    return Parents(values)
