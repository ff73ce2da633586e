"""Django's view of the CairnQ tables, for the admin and for ORM reads.

The tables belong to the protocol (see schema.py), so these models are
unmanaged: Django never generates DDL for them, and every state transition goes
through the store, never through `Model.save()` or `QuerySet.update()`.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from .records import STATUSES, TERMINAL_STATUSES


class TaskQuerySet(models.QuerySet):
    def terminal(self):
        return self.filter(status__in=TERMINAL_STATUSES)

    def live(self):
        return self.exclude(status__in=TERMINAL_STATUSES)


class Task(models.Model):
    STATUS_CHOICES = [(status, status) for status in STATUSES]

    id = models.TextField(primary_key=True)
    name = models.TextField()
    queue = models.TextField(default="default")
    status = models.TextField(choices=STATUS_CHOICES)
    payload = models.JSONField()
    result = models.JSONField(null=True)
    error = models.JSONField(null=True)
    metadata = models.JSONField(default=dict)
    progress = models.FloatField(null=True)
    message = models.TextField(null=True)
    attempt = models.IntegerField(default=0)
    max_attempts = models.IntegerField(default=3)
    priority = models.IntegerField(default=0)
    worker_id = models.TextField(null=True)
    lease_until_ms = models.BigIntegerField(null=True)
    run_at_ms = models.BigIntegerField()
    cancel_requested_at_ms = models.BigIntegerField(null=True)
    parent_id = models.TextField(null=True)
    root_id = models.TextField(null=True)
    correlation_id = models.TextField(null=True)
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()
    completed_at_ms = models.BigIntegerField(null=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        managed = False
        db_table = "cairnq_tasks"
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        permissions = [
            ("cancel_task", _("Can cancel tasks")),
            ("retry_task", _("Can retry tasks")),
            ("purge_task", _("Can purge finished tasks")),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class TaskKey(models.Model):
    key = models.TextField(primary_key=True)
    # The database cascades the delete (the protocol's FK), so Django must not.
    task = models.ForeignKey(
        Task, on_delete=models.DO_NOTHING, db_column="task_id", related_name="keys",
        db_constraint=False,
    )
    created_at_ms = models.BigIntegerField()
    updated_at_ms = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = "cairnq_task_keys"
        verbose_name = _("task key")

    def __str__(self) -> str:
        return self.key


class ProtocolMeta(models.Model):
    key = models.TextField(primary_key=True)
    value = models.TextField()

    class Meta:
        managed = False
        db_table = "cairnq_meta"
        verbose_name = _("protocol metadata")
        verbose_name_plural = _("protocol metadata")


class PeerMigration(models.Model):
    """A row of the peers' own migration ledger (not Django's)."""

    name = models.TextField(primary_key=True)
    applied_at_ms = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = "cairnq_migrations"
        verbose_name = _("peer migration")


# The schedules' state table lives with the scheduler; importing it here is how
# Django finds it.
from .schedules.models import ScheduleState  # noqa: E402,F401

# The workers table belongs to observability; importing it here is how Django finds it.
from .observability.models import WorkerRecord  # noqa: E402,F401
