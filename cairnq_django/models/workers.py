"""The workers table: one row per running worker process, kept fresh on a timer.

Unlike the protocol tables this one is Django's own (managed, with a
migration): no other CairnQ implementation reads or writes it. Times are epoch
milliseconds from the same clock the queue uses (the database's on
PostgreSQL), so hosts need not agree on the time.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

# A worker that has not reported for this many of its intervals counts as gone.
GONE_AFTER_INTERVALS = 3


class WorkerQuerySet(models.QuerySet):
    def live(self, now_ms: int) -> WorkerQuerySet:
        """Workers that reported within GONE_AFTER_INTERVALS of their interval."""
        return self.filter(
            last_seen_ms__gte=now_ms - GONE_AFTER_INTERVALS * models.F("interval_ms")
        )

    def gone(self, now_ms: int) -> WorkerQuerySet:
        return self.filter(
            last_seen_ms__lt=now_ms - GONE_AFTER_INTERVALS * models.F("interval_ms")
        )


class WorkerRecord(models.Model):
    id = models.TextField(primary_key=True, help_text=_("The worker_id on the tasks it holds."))
    host = models.TextField()
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    names = models.JSONField(default=list)
    concurrency = models.IntegerField()
    version = models.TextField()
    started_at_ms = models.BigIntegerField()
    last_seen_ms = models.BigIntegerField()
    interval_ms = models.IntegerField()
    tasks_running = models.IntegerField(default=0)
    tasks_done = models.BigIntegerField(default=0)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        db_table = "cairnq_django_workers"
        ordering = ["host", "pid"]
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return f"{self.id} ({self.host}:{self.pid})"

    def is_live(self, now_ms: int) -> bool:
        return self.last_seen_ms >= now_ms - GONE_AFTER_INTERVALS * self.interval_ms
