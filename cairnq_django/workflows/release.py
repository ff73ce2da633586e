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

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import F, Q

from ..flow.limits import clear_limit
from ..models import WorkflowEdge, WorkflowStep
from ..records import TERMINAL_STATUSES, TaskRecord, TaskSpec
from ..store import ApplicationOperations
from . import STEP_KEY
from .statements import (
    COUNT_DOWN_STEP,
    COUNT_DOWN_WORKFLOW,
    END_STEP,
    RELEASE_STEP,
    WAITING_CHILDREN,
    waiting_children,
)
from .steps import CONCURRENCY_PREFIX, task_spec


def step_marker(row: TaskRecord) -> dict[str, Any] | None:
    """The workflow marker of a task row's metadata, or None for a plain task."""
    marker = row.metadata.get(STEP_KEY) if isinstance(row.metadata, dict) else None
    if not isinstance(marker, dict):
        return None
    # A handler can replace its row's metadata: only a well-formed marker is looked up.
    return marker if isinstance(marker.get("step"), str) and isinstance(marker.get("workflow"), str) else None


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
    values = {"step": marker["step"], "workflow": marker["workflow"], "task": row.id, "state": row.status}
    if not store.run(END_STEP, values):
        return
    if grafts and row.status == "succeeded":
        from .grafting import write_grafts  # a graft is rare; its module loads when used

        write_grafts(store, WorkflowStep.objects.using(store.using).get(pk=marker["step"]), grafts)
    _cascade(store, marker["workflow"], {marker["step"]: row.status})


def finish(store: ApplicationOperations, workflow_id: str, ended: Iterable[tuple[WorkflowStep, str]]) -> None:
    """Record steps' ends, count down (or cancel) their children, release those now due."""
    outcome = {step.pk: status for step, status in ended}
    _record(store, outcome)
    _cascade(store, workflow_id, outcome)


def _record(store: ApplicationOperations, outcome: dict[str, str]) -> None:
    """Write each step's end state, one statement per distinct state."""
    steps = WorkflowStep.objects.using(store.using)
    for state in set(outcome.values()):
        steps.filter(pk__in=[pk for pk, s in outcome.items() if s == state]).update(state=state)


def _cascade(store: ApplicationOperations, workflow_id: str, outcome: dict[str, str]) -> None:
    """After `outcome`'s steps ended (their states written): count down their children, release the due.

    The task rows of the steps now due are written last (release()).
    """
    closed = unsuccessful = 0
    due: list[WorkflowStep] = []
    while outcome:
        closed += len(outcome)
        unsuccessful += sum(status != "succeeded" for status in outcome.values())
        children, ended_of = _waiting_children(store, outcome)
        canceled: dict[str, str] = {}
        counted: dict[int, list[str]] = defaultdict(list)
        for child in children:
            ended_parents = ended_of[child.pk]
            if child.when == "succeeded" and any(s != "succeeded" for s in ended_parents):
                canceled[child.pk] = "canceled"
                continue
            child.pending -= len(ended_parents)
            if child.pending <= 0:
                due.append(child)  # release() writes its state and count
            else:
                counted[len(ended_parents)].append(child.pk)
        _count_down(store, counted)
        _record(store, canceled)
        outcome = canceled
    _count_down_workflow(store, workflow_id, closed, unsuccessful)
    release(store, due)


def _waiting_children(
    store: ApplicationOperations, outcome: dict[str, str]
) -> tuple[list[WorkflowStep], dict[str, list[str]]]:
    """The ended steps' waiting children (locked), and the end states of each child's ended parents."""
    if len(outcome) == 1:
        # One parent, the usual settle: an edge is unique per (parent, child), so it is each child's only one.
        [(parent, status)] = outcome.items()
        children = [_child(row) for row in store.run(WAITING_CHILDREN, {"parent": parent})]
        return children, {child.pk: [status] for child in children}
    steps = WorkflowStep.objects.using(store.using)
    children = [_child(row) for row in waiting_children(steps, Q(parent_id__in=list(outcome)))]
    ended_of: dict[str, list[str]] = defaultdict(list)
    for parent_id, child_id in WorkflowEdge.objects.using(store.using).filter(
        parent_id__in=list(outcome), child_id__in=[c.pk for c in children]
    ).values_list("parent_id", "child_id"):
        ended_of[child_id].append(outcome[parent_id])
    return children, ended_of


def _child(row: Sequence[Any]) -> WorkflowStep:
    """A waiting child read as CHILD_COLUMNS, as an unsaved model instance (its JSON decoded)."""
    pk, when, pending, workflow_id, name, task_name, payload, options = row
    return WorkflowStep(
        id=pk, when=when, pending=pending, workflow_id=workflow_id, name=name, task_name=task_name,
        payload=json.loads(payload), options=json.loads(options), state="waiting",
    )


def _count_down(store: ApplicationOperations, counted: dict[int, list[str]]) -> None:
    """Lower the waiting counts: `counted` maps a decrement to the steps it applies to."""
    for by, pks in counted.items():
        if len(pks) == 1:  # a fan-in's parent ending: its one child
            store.run(COUNT_DOWN_STEP, {"step": pks[0], "by": by})
        else:
            WorkflowStep.objects.using(store.using).filter(pk__in=pks).update(pending=F("pending") - by)


def release(store: ApplicationOperations, due: Sequence[WorkflowStep]) -> None:
    """Mark steps whose parents are all done released, and insert their task rows.

    The task rows are written last, so the commit follows their INSERT as
    closely as it follows an enqueue's: a released step is picked up as
    fast as a task enqueued at that instant. Their ids are the specs' own,
    known before the insert.
    """
    if not due:
        return
    specs: list[TaskSpec] = []
    for step in due:
        spec = task_spec(store, step)
        specs.append(spec)
        step.task_id, step.state, step.pending = spec["id"], "released", 0
    if len(due) == 1:
        store.run(RELEASE_STEP, {"step": due[0].pk, "task": due[0].task_id})
    else:
        # One statement per batch, not one per step: a fan-out releases thousands at once.
        WorkflowStep.objects.using(store.using).bulk_update(
            due, ["task_id", "state", "pending"], batch_size=500
        )
    store.submit_many(specs)


def _count_down_workflow(
    store: ApplicationOperations, workflow_id: str, closed: int, unsuccessful: int
) -> None:
    """Lower the workflow's open count (its row locked last), ending it when nothing is open.

    A workflow is only ever ended by the count-down that closes its last
    open step, so a state other than "running" coming back is this one's end.
    """
    if not closed:
        return
    [(state, concurrency)] = store.run(
        COUNT_DOWN_WORKFLOW,
        {"workflow": workflow_id, "closed": closed, "unsuccessful": unsuccessful},
        shape=(unsuccessful > 0,),
    )
    if state != "running" and concurrency is not None:
        clear_limit("key_prefix", CONCURRENCY_PREFIX + workflow_id, using=store.using)
