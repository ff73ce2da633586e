"""Grafts: steps a running step adds (ctx.workflow.add), written inside that step's completion.

A graft runs after the step that added it; `blocks=` names steps that must
wait for it too. Their pending counts go up in the same transaction that
counts down the grafting step's children, so a blocked step can never be
released before its grafts have run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db.models import F

from ..ids import ulid
from ..jsoncodec import dumps
from ..models import Workflow, WorkflowEdge, WorkflowStep
from ..store import ApplicationOperations
from ..validators import MAX_NAME_LENGTH, check_label
from .steps import InvalidWorkflow, task_name

logger = logging.getLogger("cairnq_django.workflows")

_GRAFT_OPTIONS = frozenset({"queue", "priority", "max_attempts", "concurrency_key"})


def graft(
    name: str, task: Any, payload: Any = None, *, blocks: Any = None, **options: Any
) -> dict[str, Any]:
    """Check one graft and return it as written later (ValueError at once, not at completion)."""
    check_label("Step name", name, MAX_NAME_LENGTH)
    unknown = sorted(set(options) - _GRAFT_OPTIONS)
    if unknown:
        raise InvalidWorkflow(f"A grafted step takes no option {', '.join(unknown)}.")
    dumps({} if payload is None else payload, what=f"payload of grafted step {name!r}")
    blocked = [] if blocks is None else [blocks] if isinstance(blocks, str) else list(blocks)
    return {"name": name, "task": task_name(task), "payload": payload, "blocks": blocked,
            "options": options}


def write_grafts(store: ApplicationOperations, step: WorkflowStep, grafts: Sequence[dict[str, Any]]) -> None:
    """Insert the grafts as children of `step` and raise their blocked steps' counts."""
    using = store.using
    steps = WorkflowStep.objects.using(using)
    runs = Workflow.objects.using(using)
    after = runs.values_list("steps_total", flat=True).get(pk=step.workflow_id)
    rows = [
        WorkflowStep(
            id="wfs_" + ulid(), position=after + offset, workflow_id=step.workflow_id,
            name=g["name"], group=g["name"],
            task_name=g["task"],
            payload={} if g["payload"] is None else g["payload"], options=g["options"], pending=1,
        )
        for offset, g in enumerate(grafts)
    ]
    steps.bulk_create(rows)
    by_name = {row.name: row for row in rows}
    edges = [WorkflowEdge(workflow_id=step.workflow_id, parent_id=step.pk, child_id=row.pk) for row in rows]
    blocked_names = sorted({name for g in grafts for name in g["blocks"]})
    blocked = steps.select_for_update().filter(
        workflow_id=step.workflow_id, name__in=blocked_names
    ).order_by("pk")
    for target in blocked:
        if target.state != "waiting":
            logger.warning("Step %s already runs or ended; grafts cannot block it.", target.name)
            continue
        blockers = [by_name[g["name"]] for g in grafts if target.name in g["blocks"]]
        steps.filter(pk=target.pk).update(pending=F("pending") + len(blockers))
        edges += [WorkflowEdge(workflow_id=step.workflow_id, parent_id=b.pk, child_id=target.pk)
                  for b in blockers]
    WorkflowEdge.objects.using(using).bulk_create(edges)
    Workflow.objects.using(using).filter(pk=step.workflow_id).update(
        steps_total=F("steps_total") + len(rows), steps_open=F("steps_open") + len(rows)
    )
