"""The protocol's tables at schema 10: tasks, their keys, the meta row, the peers' ledger.

The models are the schema: `makemigrations` writes the migrations from them,
and every column, default, CHECK and index here is what the protocol's peers
create (tests/test_schema.py compares the catalogs). Peers in other languages
read and write the same rows, so every state transition goes through the store,
never through `Model.save()` or `QuerySet.update()`.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q, Value
from django.utils.translation import gettext_lazy as _

from ..db.fields import (
    CascadingForeignKey,
    EpochMillisField,
    ProtocolIndex,
    ProtocolTextField,
)
from ..db.querysets import TaskQuerySet
from ..records import STATUSES, TERMINAL_STATUSES


class Task(models.Model):
    STATUS_CHOICES = [(status, status) for status in STATUSES]

    id = ProtocolTextField(primary_key=True)
    name = models.TextField()
    queue = models.TextField(db_default="default")
    status = models.TextField(choices=STATUS_CHOICES)
    payload = models.JSONField()
    result = models.JSONField(null=True)
    error = models.JSONField(null=True)
    metadata = models.JSONField(db_default=Value({}, output_field=models.JSONField()))
    progress = models.FloatField(null=True)
    message = models.TextField(null=True)
    attempt = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField(db_default=3)
    priority = models.IntegerField(db_default=0)
    worker_id = models.TextField(null=True)
    lease_until_ms = EpochMillisField(null=True)
    run_at_ms = EpochMillisField()
    cancel_requested_at_ms = EpochMillisField(null=True)
    parent_id = models.TextField(null=True)
    root_id = models.TextField(null=True)
    correlation_id = models.TextField(null=True)
    created_at_ms = EpochMillisField()
    updated_at_ms = EpochMillisField()
    completed_at_ms = EpochMillisField(null=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        db_table = "cairnq_tasks"
        # The protocol's index set at schema 10, under its own names. Partial
        # predicates match the statements' WHERE terms, since SQLite uses a
        # partial index only when it can prove the query implies it.
        indexes = [
            ProtocolIndex(
                fields=["queue", "status", "-priority", "run_at_ms", "id"],
                name="cairnq_tasks_claim_idx",
            ),
            ProtocolIndex(
                fields=["queue", "status", "name", "-priority", "run_at_ms", "id"],
                name="cairnq_tasks_claim_name_idx",
            ),
            ProtocolIndex(fields=["name"], name="cairnq_tasks_name_idx"),
            ProtocolIndex(fields=["root_id"], name="cairnq_tasks_root_idx"),
            ProtocolIndex(fields=["correlation_id"], name="cairnq_tasks_correlation_idx"),
            ProtocolIndex(fields=["completed_at_ms"], name="cairnq_tasks_completed_idx"),
            ProtocolIndex(
                fields=["status", "completed_at_ms"], name="cairnq_tasks_status_completed_idx"
            ),
            ProtocolIndex(
                fields=["lease_until_ms"],
                name="cairnq_tasks_lease_idx",
                condition=Q(status="running") & Q(lease_until_ms__isnull=False),
            ),
            ProtocolIndex(
                fields=["queue", "completed_at_ms"],
                name="cairnq_tasks_queue_completed_idx",
                condition=Q(status__in=TERMINAL_STATUSES),
            ),
        ]
        constraints = [
            # The name PostgreSQL gives the peers' unnamed column CHECK.
            models.CheckConstraint(
                condition=Q(status__in=STATUSES), name="cairnq_tasks_status_check"
            ),
        ]
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
    key = ProtocolTextField(primary_key=True)
    # The database cascades a task's delete to its key (see CascadingForeignKey),
    # whoever deletes it, so Django must not try to.
    task = CascadingForeignKey(Task, on_delete=models.DO_NOTHING, related_name="keys")
    created_at_ms = EpochMillisField()
    updated_at_ms = EpochMillisField()

    class Meta:
        db_table = "cairnq_task_keys"
        verbose_name = _("task key")

    def __str__(self) -> str:
        return self.key


class ProtocolMeta(models.Model):
    key = ProtocolTextField(primary_key=True)
    value = models.TextField()

    class Meta:
        db_table = "cairnq_meta"
        verbose_name = _("protocol metadata")
        verbose_name_plural = _("protocol metadata")

    def __str__(self) -> str:
        return self.key


class PeerMigration(models.Model):
    """A row of the peers' own migration ledger (not Django's)."""

    name = ProtocolTextField(primary_key=True)
    applied_at_ms = EpochMillisField()

    class Meta:
        db_table = "cairnq_migrations"
        verbose_name = _("peer migration")

    def __str__(self) -> str:
        return self.name
