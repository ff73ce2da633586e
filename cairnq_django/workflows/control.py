"""Cancel and retry a workflow, and the sweeper's backstop for steps another SDK's worker finished."""

from __future__ import annotations

from collections import defaultdict

from django.db import transaction

from ..flow.limits import set_limit
from ..models import Task, Workflow, WorkflowEdge, WorkflowStep
from ..records import TERMINAL_STATUSES
from ..store import get_store
from .release import after_settle, finish, release
from .steps import CONCURRENCY_PREFIX, InvalidWorkflow

RETRY_MODES = ("failed_only", "failed_and_downstream", "all")


def cancel_workflow(workflow_id: str, *, using: str | None = None) -> int:
    """Cancel every step that has not ended; return how many.

    Waiting steps and queued tasks end now; a running step is asked to
    cancel and ends when its worker settles it. Its task rows are locked
    before its step rows and the workflow row last, the order a settle takes.
    """
    store = get_store(using)
    steps = WorkflowStep.objects.using(store.using)
    with transaction.atomic(using=store.using):
        open_steps = list(
            steps.filter(workflow_id=workflow_id, state__in=("waiting", "released")).order_by("pk")
        )
        ended = []
        for step in open_steps:
            if step.state == "released" and step.task_id:
                row = store.cancel(step.task_id)
                if row is not None and row.status == "canceled":
                    ended.append((step, "canceled"))
        waiting = steps.select_for_update().filter(
            pk__in=[s.pk for s in open_steps], state="waiting"
        ).order_by("pk")
        ended += [(step, "canceled") for step in waiting]
        Workflow.objects.using(store.using).filter(pk=workflow_id, state="running").update(
            cancel_requested=True
        )
        finish(store, workflow_id, ended)
    return len(open_steps)


def retry_workflow(workflow_id: str, *, mode: str = "failed_only", using: str | None = None) -> int:
    """Run steps of a finished workflow again; return how many were reset.

    "failed_only": the failed and canceled steps, and the steps that never
    ran because of them; steps that ended well keep their results.
    "failed_and_downstream": those and every step downstream of them, even
    one that ran (a `when="finished"` step). "all": every step, from the start.
    """
    if mode not in RETRY_MODES:
        raise ValueError(f"mode must be one of {', '.join(RETRY_MODES)}, got {mode!r}.")
    store = get_store(using)
    alias = store.using
    with transaction.atomic(using=alias):
        run = Workflow.objects.using(alias).select_for_update().get(pk=workflow_id)
        if run.state == "running":
            raise InvalidWorkflow(
                f"Workflow {workflow_id} is still running; wait for it or cancel it before a retry."
            )
        steps = {s.pk: s for s in WorkflowStep.objects.using(alias).filter(workflow_id=workflow_id)}
        children: dict[str, list[str]] = defaultdict(list)
        parents: dict[str, list[str]] = defaultdict(list)
        for parent, child in WorkflowEdge.objects.using(alias).filter(
            workflow_id=workflow_id
        ).values_list("parent_id", "child_id"):
            children[parent].append(child)
            parents[child].append(parent)
        if mode == "all":
            reset = set(steps)
        else:
            reset = {pk for pk, s in steps.items() if s.state in ("failed", "canceled")}
            if mode == "failed_and_downstream":
                todo = list(reset)
                while todo:
                    for child in children[todo.pop()]:
                        if child not in reset:
                            reset.add(child)
                            todo.append(child)
        for pk in reset:
            step = steps[pk]
            step.state, step.task_id = "waiting", None
            step.pending = sum(p in reset for p in parents[pk])
        WorkflowStep.objects.using(alias).bulk_update(
            [steps[pk] for pk in reset], ["state", "task_id", "pending"], batch_size=1000
        )
        kept = [s for pk, s in steps.items() if pk not in reset]
        run.state, run.cancel_requested, run.finished_at_ms = "running", False, None
        run.steps_open = len(reset)
        run.steps_unsuccessful = sum(s.state in ("failed", "canceled") for s in kept)
        run.save(update_fields=[
            "state", "cancel_requested", "finished_at_ms", "steps_open", "steps_unsuccessful",
        ])
        if run.concurrency is not None:
            set_limit("key_prefix", CONCURRENCY_PREFIX + run.id, concurrency=run.concurrency,
                      using=alias, by=f"workflow {run.id}")
        release(store, sorted((steps[pk] for pk in reset if steps[pk].pending == 0), key=lambda s: s.pk))
    return len(reset)


def release_finished_steps(*, using: str | None = None, limit: int = 500) -> int:
    """Backstop: settle released steps whose task ended without this package's worker; return how many.

    A worker of another CairnQ SDK completes a step's task like any task,
    and lease recovery can fail one for good inside a claim; neither
    releases its children. The sweeper (cairnq_sweep) calls this each
    round: each such step is settled in its own short transaction, as the
    worker would have.
    """
    store = get_store(using)
    alias = store.using
    released = WorkflowStep.objects.using(alias).filter(state="released").values("task_id")
    ended = list(
        Task.objects.using(alias).filter(id__in=released, status__in=TERMINAL_STATUSES)
        .order_by("completed_at_ms", "id").values_list("id", flat=True)[:limit]
    )
    settled = 0
    for task_id in ended:
        with transaction.atomic(using=alias):
            row = store.get(task_id)
            if row is not None:
                after_settle(store, row)
                settled += 1
    return settled
