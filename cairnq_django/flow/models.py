"""The app's own flow-control tables (other CairnQ implementations neither read nor write them)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..fields import CascadingOneToOneField


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
