"""Which queues are paused: one row per queue that was ever paused, managed by Django.

Like the workers and schedules tables this one is the app's own (an ordinary
migration); other CairnQ implementations neither read nor write it, so only
Django workers honour a pause. A resumed queue keeps its row (paused false)
so the page and the command can say who resumed it and when.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


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
