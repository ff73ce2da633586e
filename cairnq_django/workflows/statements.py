"""The release's statements for the common case, compiled once per alias like the store's.

A step's settle runs these inside its parent's completion. Built through
the ORM and compiled once (store/statement_cache.py), each run only binds
values: compiling an UPDATE with its CASE costs more than running it, and
the release sits between a parent's completion and its children's start.
The rarer shapes (many parents ending at once, a cancel cascade, a fan-out
released together) use the ORM directly in release.py.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Case, F, Q, QuerySet, Value, When

from ..db.expressions import NowMs, Param, RawText, text_param
from ..models import Workflow, WorkflowEdge, WorkflowStep
from ..store.django_private import Template, select_sql, update_sql
from ..store.statement_cache import Statement


def _count(name: str) -> Param:
    return Param(name, models.IntegerField())


def _build_end_step(using: str) -> Template:
    # Takes the step's row lock and checks that it is still this task's open step of that workflow.
    return update_sql(
        WorkflowStep.objects.using(using).filter(
            pk=text_param("step"), workflow_id=text_param("workflow"),
            task_id=text_param("task"), state="released",
        ),
        {"state": text_param("state")},
        [F("id")],
    )


# What the count-down and the release read of a waiting child: its rule, its count, its task.
CHILD_COLUMNS = (
    F("id"), F("when"), F("pending"), F("workflow_id"), F("name"), F("task_name"),
    RawText("payload"), RawText("options"),
)


def waiting_children(steps: QuerySet[WorkflowStep], parents: Q) -> QuerySet[Any, Any]:
    """The waiting children of the parents `parents` picks (an edge filter), locked in id order.

    In id order: two parents finishing at once lock shared children in the same order.
    """
    of_parents = WorkflowEdge.objects.using(steps.db).filter(parents)
    return (
        steps.select_for_update().filter(pk__in=of_parents.values("child_id"), state="waiting")
        .order_by("pk").values_list(*CHILD_COLUMNS)
    )


def _build_waiting_children(using: str) -> Template:
    return select_sql(waiting_children(WorkflowStep.objects.using(using), Q(parent_id=text_param("parent"))))


def _build_count_down_step(using: str) -> Template:
    return update_sql(
        WorkflowStep.objects.using(using).filter(pk=text_param("step")),
        {"pending": F("pending") - _count("by")},
        [F("id")],
    )


def _build_release_step(using: str) -> Template:
    return update_sql(
        WorkflowStep.objects.using(using).filter(pk=text_param("step")),
        {"task_id": text_param("task"), "state": Value("released"), "pending": Value(0)},
        [F("id")],
    )


def _build_count_down_workflow(using: str, failed_here: bool) -> Template:
    """Lower the open count and, when it reaches zero, end the workflow, in one UPDATE.

    SET reads the row's old values, so `ends` is "this count-down closes
    the last open steps". Returns the state and the concurrency, so the
    caller knows whether a limit is to be removed without reading again.
    """
    ends = Q(state="running", steps_open__lte=_count("closed"))
    failed = ends if failed_here else ends & Q(steps_unsuccessful__gt=0)
    return update_sql(
        Workflow.objects.using(using).filter(pk=text_param("workflow")),
        {
            "steps_open": F("steps_open") - _count("closed"),
            "steps_unsuccessful": F("steps_unsuccessful") + _count("unsuccessful"),
            "state": Case(
                When(ends & Q(cancel_requested=True), then=Value("canceled")),
                When(failed, then=Value("failed")),
                When(ends, then=Value("succeeded")),
                default=F("state"),
                output_field=models.CharField(),
            ),
            "finished_at_ms": Case(
                When(ends, then=NowMs()), default=F("finished_at_ms"),
                output_field=models.BigIntegerField(),
            ),
        },
        [F("state"), F("concurrency")],
    )


END_STEP = Statement(_build_end_step)
WAITING_CHILDREN = Statement(_build_waiting_children)
COUNT_DOWN_STEP = Statement(_build_count_down_step)
RELEASE_STEP = Statement(_build_release_step)
COUNT_DOWN_WORKFLOW = Statement(_build_count_down_workflow)
