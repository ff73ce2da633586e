"""Flow control's own tables (flow/): paused queues, run-time limits, task keys and snoozes, rate starts.

Like the workers and schedules tables they are the app's own (ordinary
migrations); other CairnQ implementations neither read nor write them, so only
Django workers honour a pause or a limit, or count a snooze.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..db.fields import CascadingOneToOneField


class QueueState(models.Model):
    queue = models.TextField(primary_key=True)
    paused = models.BooleanField(default=False)
    # When the flag last changed, in epoch ms from the queue's clock (the
    # database's on PostgreSQL), and who changed it (free text: a user name,
    # "manage.py cairnq_queue", or whatever the caller of pause_queue said).
    changed_at_ms = models.BigIntegerField()
    changed_by = models.TextField(blank=True, default="")

    class Meta:
        db_table = "cairnq_django_queue_state"
        ordering = ["queue"]
        verbose_name = _("queue state")
        verbose_name_plural = _("queue states")
        permissions = [("pause_queue", _("Can pause and resume queues"))]

    def __str__(self) -> str:
        return self.queue


class TaskFlow(models.Model):
    """A task's flow-control state: its concurrency key, how often it was snoozed.

    The protocol's tables are fixed, so these live here: a row from the
    enqueue that gave a concurrency key, or from the first snooze. The
    database cascades a task's delete to this row, whoever purges the task.
    """

    task = CascadingOneToOneField(
        "cairnq_django.Task", primary_key=True, on_delete=models.DO_NOTHING, related_name="flow"
    )
    snoozes = models.IntegerField(default=0)
    # enqueue(..., concurrency_key=...): a "key_prefix" limit (FlowLimit, or
    # CAIRNQ["LIMITS"]) caps the running tasks of each distinct key under it.
    concurrency_key = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "cairnq_django_task_flow"
        verbose_name = _("task flow")
        verbose_name_plural = _("task flow")

    def __str__(self) -> str:
        return f"{self.task_id}: {self.snoozes} snoozes"


class FlowLimit(models.Model):
    """A limit set at run time (flow/limits.py, set_limit).

    It overrides the CAIRNQ["LIMITS"] entry on the same scope and value.
    Neither concurrency nor rate: no limit, which lifts the settings' one.
    """

    SCOPE_CHOICES = [("queue", _("queue")), ("name", _("task name")), ("key_prefix", _("key prefix"))]

    scope = models.TextField(choices=SCOPE_CHOICES)
    value = models.TextField()
    concurrency = models.IntegerField(null=True, blank=True)
    rate = models.IntegerField(null=True, blank=True)
    per_ms = models.BigIntegerField(null=True, blank=True)
    # As QueueState's: epoch ms from the queue's clock, and free text.
    changed_at_ms = models.BigIntegerField()
    changed_by = models.TextField(blank=True, default="")

    class Meta:
        db_table = "cairnq_django_flow_limit"
        ordering = ["scope", "value"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "value"], name="cairnq_django_flow_limit_uniq"),
        ]
        verbose_name = _("flow limit")
        verbose_name_plural = _("flow limits")
        # The dashboard's set/clear form (admin/flow_limit_admin.py), as
        # QueueState's pause_queue guards the pause buttons.
        permissions = [("change_limits", _("Can set and clear flow limits at run time"))]

    def __str__(self) -> str:
        return f"{self.scope} {self.value}"


class FlowStart(models.Model):
    """One task start under a rate limit: the sliding window's log (store/limited_claim.py).

    `value` is the queue, the name, or (for a key_prefix limit) the task's
    concrete concurrency key. The limited claim writes these and prunes the
    ones older than the longest period.
    """

    scope = models.TextField()
    value = models.TextField()
    started_at_ms = models.BigIntegerField()

    class Meta:
        db_table = "cairnq_django_flow_start"
        indexes = [
            models.Index(fields=["scope", "value", "started_at_ms"], name="cairnq_django_flow_start_idx"),
        ]
        verbose_name = _("flow start")
        verbose_name_plural = _("flow starts")

    def __str__(self) -> str:
        return f"{self.scope} {self.value} at {self.started_at_ms}"
