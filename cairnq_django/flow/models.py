"""The app's own flow-control tables: which queues are paused, how often a task was snoozed.

Like the workers and schedules tables these are the app's own (ordinary
migrations); other CairnQ implementations neither read nor write them, so only
Django workers honour a pause or count a snooze. A resumed queue keeps its row
(paused false) so the page and the command can say who resumed it and when.
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
    """How often a task was snoozed; a row from its first snooze on.

    The protocol's tables are fixed, so the count lives here. The database
    cascades a task's delete to this row, whoever purges the task.
    """

    task = CascadingOneToOneField(
        "cairnq_django.Task", primary_key=True, on_delete=models.DO_NOTHING, related_name="flow"
    )
    snoozes = models.IntegerField(default=0)

    class Meta:
        db_table = "cairnq_django_task_flow"
        verbose_name = _("task flow")
        verbose_name_plural = _("task flow")

    def __str__(self) -> str:
        return f"{self.task_id}: {self.snoozes} snoozes"
