"""The CairnQ tables at schema 10, declared as Django models.

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

from .db.fields import (
    CascadingForeignKey,
    CascadingOneToOneField,
    EpochMillisField,
    ProtocolIndex,
    ProtocolTextField,
)
from .db.querysets import TaskQuerySet
from .records import STATUSES, TERMINAL_STATUSES


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


# Flow control's own tables (flow/): which queues are paused, how often a task
# was snoozed. Like the workers and schedules tables they are the app's own
# (ordinary migrations); other CairnQ implementations neither read nor write
# them, so only Django workers honour a pause or count a snooze. They sit here,
# not in flow/, because flow/ works through the store, which reads them.


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


# The schedules' state table lives with the scheduler; importing it here is how
# Django finds it.
from .schedules.models import ScheduleState  # noqa: E402,F401

# isort: split
# The workers table belongs to observability; importing it here is how Django finds it.
from .observability.models import WorkerRecord  # noqa: E402,F401

# isort: split
# The workflows' tables live with their release logic; importing them here is how Django finds them.
from .workflows.models import Workflow, WorkflowEdge, WorkflowStep  # noqa: E402,F401
