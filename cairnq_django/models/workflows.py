"""A workflow's own tables: the run, its steps and the edges between them.

Django's own tables (no other CairnQ implementation reads them): a step is
a row here while it waits, and becomes an ordinary task row only once its
parents let it run (workflows/release.py), so no worker of any language can start it
early. `pending` counts the parents a waiting step still waits for; the
transaction that settles a parent counts it down under the step's row lock.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

WORKFLOW_STATES = ("running", "succeeded", "failed", "canceled")
STEP_STATES = ("waiting", "released", "succeeded", "failed", "canceled")
# A step's release policy: after every parent succeeded, or after every parent finished.
WHEN_CHOICES = ("succeeded", "finished")


class Workflow(models.Model):
    """One enqueued workflow; its counters change only in its steps' settle transactions."""

    id = models.TextField(primary_key=True)
    name = models.TextField()
    # Workflow(key=...): a running workflow with the same key is returned instead of a new one.
    key = models.TextField(null=True, blank=True, db_index=True)
    state = models.TextField(choices=[(s, s) for s in WORKFLOW_STATES], default="running")
    # Workflow(concurrency=N): at most N of its steps running fleet-wide (a flow limit).
    concurrency = models.IntegerField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    steps_total = models.IntegerField(default=0)
    # Steps not yet succeeded, failed or canceled; the workflow ends when this reaches 0.
    steps_open = models.IntegerField(default=0)
    # Steps that failed or were canceled: a workflow with any ends failed (or canceled).
    steps_unsuccessful = models.IntegerField(default=0)
    created_at_ms = models.BigIntegerField()
    finished_at_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "cairnq_django_workflow"
        ordering = ["-created_at_ms", "-id"]
        indexes = [models.Index(fields=["state", "created_at_ms"], name="cairnq_wf_state_idx")]
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        permissions = [("manage_workflow", _("Can cancel and retry workflows"))]

    def __str__(self) -> str:
        return f"{self.name} {self.id}"


class WorkflowStep(models.Model):
    """One step: its task's name, payload and options until it is released as a task row."""

    # "wfs_" + a ULID, made before the insert: a step's task row (its metadata
    # names the step) can then be written in the same statement batch as the step.
    id = models.TextField(primary_key=True)
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steps")
    # The order steps were added in (ids are random within a millisecond).
    position = models.IntegerField(default=0)
    # Unique in the workflow: the add() name, or "name[i]" for the i-th step of a map().
    name = models.TextField()
    # The add()/map() name that ctx.parents[...] groups by, and the step's place in a map.
    group = models.TextField()
    index = models.IntegerField(null=True, blank=True)
    task_name = models.TextField()
    payload = models.JSONField(default=dict)
    # enqueue()'s options for the task row: queue, priority, max_attempts, delay_ms, key, ...
    options = models.JSONField(default=dict)
    when = models.TextField(choices=[(w, w) for w in WHEN_CHOICES], default="succeeded")
    # Parents this step still waits for; released as a task when it reaches 0.
    pending = models.IntegerField(default=0)
    state = models.TextField(choices=[(s, s) for s in STEP_STATES], default="waiting")
    # The task row once released. Not a foreign key: the task table is the
    # protocol's, and finished tasks are purged.
    task_id = models.TextField(null=True, blank=True, unique=True)

    class Meta:
        db_table = "cairnq_django_workflow_step"
        ordering = ["workflow", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="cairnq_wf_step_name_uniq"),
        ]
        indexes = [
            # The sweeper's backstop reads only released steps.
            models.Index(fields=["state"], name="cairnq_wf_step_released_idx",
                         condition=Q(state="released")),
        ]
        verbose_name = _("workflow step")
        verbose_name_plural = _("workflow steps")

    def __str__(self) -> str:
        return self.name


class WorkflowEdge(models.Model):
    """`child` runs after `parent` (by the child's `when` policy)."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="edges")
    parent = models.ForeignKey(WorkflowStep, on_delete=models.CASCADE, related_name="child_edges")
    child = models.ForeignKey(WorkflowStep, on_delete=models.CASCADE, related_name="parent_edges")

    class Meta:
        db_table = "cairnq_django_workflow_edge"
        constraints = [
            models.UniqueConstraint(fields=["parent", "child"], name="cairnq_wf_edge_uniq"),
        ]
        verbose_name = _("workflow edge")
        verbose_name_plural = _("workflow edges")

    def __str__(self) -> str:
        return f"{self.parent_id} -> {self.child_id}"
