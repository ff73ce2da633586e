"""Where each schedule has got to: one row per schedule name, managed by Django.

Unlike the protocol's tables this one is Django's own (other CairnQ
implementations neither read nor write it), so it is a managed model with an
ordinary migration. The scheduler advances `cursor_ms` only by compare-and-set
(schedules/state.py), in the transaction that enqueues the occurrence.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..records import MAX_SCHEDULE_NAME_LENGTH


class ScheduleState(models.Model):
    name = models.CharField(max_length=MAX_SCHEDULE_NAME_LENGTH, primary_key=True)
    # Every occurrence at or before this instant (epoch ms) has been dealt
    # with: enqueued, or passed over by the missed-occurrence policy.
    cursor_ms = models.BigIntegerField()
    # The occurrence last enqueued by the schedule (not by "run now").
    last_occurrence_ms = models.BigIntegerField(null=True, blank=True)
    # The task the schedule or "run now" last enqueued. Not a foreign key:
    # finished tasks are purged, and the task table belongs to the protocol.
    last_task_id = models.TextField(null=True, blank=True)
    last_enqueued_at_ms = models.BigIntegerField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()

    class Meta:
        db_table = "cairnq_django_schedules"
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        permissions = [
            ("run_schedule", _("Can run a schedule now")),
            ("pause_schedule", _("Can pause and resume schedules")),
        ]

    def __str__(self) -> str:
        return self.name
