"""Attempt history: one row per attempt of a task that did not succeed (store/attempts.py)."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..db.fields import CascadingForeignKey


class TaskAttempt(models.Model):
    """One attempt of a task that did not succeed: retried, failed, snoozed, canceled or lost.

    The app's own table (the protocol's are fixed); store/attempts.py writes a
    row in the transaction of the settle it describes, and reads a task's
    history as these rows plus its current attempt from the task row itself,
    so an attempt that succeeds at once writes nothing here. The database
    cascades a task's delete to its attempts, whoever purges it. Peers in
    other languages write none: their attempts show as unrecorded.
    """

    OUTCOME_CHOICES = [
        (outcome, outcome) for outcome in ("retried", "failed", "snoozed", "canceled", "lost")
    ]

    task = CascadingForeignKey(
        "cairnq_django.Task", on_delete=models.DO_NOTHING, related_name="attempts"
    )
    attempt = models.IntegerField()
    outcome = models.TextField(choices=OUTCOME_CHOICES)
    worker_id = models.TextField(null=True)
    # Epoch ms from the queue's clock. The start is the claim's stamp, which the
    # worker keeps; a lost attempt's start is not known (the claim wrote no row).
    started_at_ms = models.BigIntegerField(null=True)
    ended_at_ms = models.BigIntegerField()
    error = models.JSONField(null=True)

    class Meta:
        db_table = "cairnq_django_task_attempt"
        indexes = [
            models.Index(fields=["task", "attempt"], name="cairnq_django_attempt_task_idx"),
        ]
        verbose_name = _("task attempt")
        verbose_name_plural = _("task attempts")

    def __str__(self) -> str:
        return f"{self.task_id} attempt {self.attempt}: {self.outcome}"
