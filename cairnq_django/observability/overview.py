"""The queue and its workers at a glance: shared by cairnq_status, cairnq_health,
the metrics view and the admin dashboard."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..flow.limits import LimitUsage, limit_usage
from ..flow.pausing import paused_queues
from ..models import Task, WorkerRecord
from ..store import get_store
from ..store.admin_reads import QueueStats, queue_stats
from ..workflows.reads import count_by_state
from .flow import busiest_keys


def database_now_ms(using: str) -> int:
    """Return "now" from the clock the queue uses (the database's on PostgreSQL)."""
    return get_store(using).clock_ms()


@dataclass
class RunningTask:
    id: str
    name: str
    queue: str
    progress: float | None


@dataclass
class WorkerView:
    """One worker's row with its liveness and the tasks it holds now."""

    record: WorkerRecord
    live: bool
    seen_ago_ms: int
    running: list[RunningTask] = field(default_factory=list)


@dataclass
class Overview:
    now_ms: int
    queues: list[QueueStats]
    workers: list[WorkerView]
    # Queues no Django worker claims from (flow/pausing.py), sorted.
    paused: list[str] = field(default_factory=list)
    # Each flow limit in force and its use (flow/limits.py), settings first.
    limits: list[LimitUsage] = field(default_factory=list)
    # Why `limits` is empty although limits are configured: CAIRNQ["LIMITS"]
    # is invalid (the system checks say where). The pages still render.
    limits_error: str | None = None
    # Per key_prefix limit's prefix, the key with the most running tasks.
    busiest_keys: dict[str, str] = field(default_factory=dict)
    # How many workflows are in each state (workflows/reads.py).
    workflows: dict[str, int] = field(default_factory=dict)

    def live_workers_for(self, queue: str) -> list[WorkerView]:
        return [w for w in self.workers if w.live and queue in w.record.queues]


def workers(using: str, now: int) -> list[WorkerView]:
    """Every recorded worker, live or gone, with the running tasks it holds."""
    views = [
        WorkerView(record=r, live=r.is_live(now), seen_ago_ms=max(0, now - r.last_seen_ms))
        for r in WorkerRecord.objects.using(using).order_by("host", "pid", "id")
    ]
    by_id = {v.record.id: v for v in views}
    if by_id:
        held = (
            Task.objects.using(using)
            .running().filter(worker_id__in=list(by_id))
            .values_list("id", "name", "queue", "progress", "worker_id")
            .order_by("id")
        )
        for task_id, name, queue, progress, worker_id in held:
            # worker_id__in filtered out NULL, whatever the nullable column's type says.
            by_id[str(worker_id)].running.append(RunningTask(task_id, name, queue, progress))
    return views


def overview(using: str | None = None) -> Overview:
    """Read the queue × status table, the oldest due ages and the workers."""
    using = using or get_store().using
    now = database_now_ms(using)
    try:
        limits, limits_error = limit_usage(using=using), None
    except ValueError as exc:
        limits, limits_error = [], str(exc)
    return Overview(
        now_ms=now, queues=queue_stats(using, now), workers=workers(using, now),
        paused=paused_queues(using=using), limits=limits, limits_error=limits_error,
        busiest_keys=busiest_keys(using, limits), workflows=count_by_state(using=using),
    )
