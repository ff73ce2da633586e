"""Is the queue healthy? The rules behind `manage.py cairnq_health`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connections
from django.db.utils import Error as DatabaseError

from ..conf import cairnq_settings
from ..errors import CairnQError, TablesMissing
from ..humanize import first_line
from ..humanize import human_duration as format_duration
from ..models.workers import GONE_AFTER_INTERVALS
from ..store import get_store
from ..tables import known_missing_tables
from .overview import Overview, overview
from .unhandled import registered_names, unhandled_names

# Exit codes of cairnq_health.
HEALTHY = 0
UNHEALTHY = 1
UNREACHABLE = 2


@dataclass(frozen=True)
class Health:
    code: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.code == HEALTHY


def problems(view: Overview, *, max_age_ms: int, queues: Sequence[str] | None = None) -> list[str]:
    """One sentence per queue with due tasks no live worker serves or that waited too long."""
    found = []
    for q in view.queues:
        if queues and q.queue not in queues:
            continue
        if q.oldest_due_age_ms is None:
            continue  # nothing due: nothing can be stuck
        if q.queue in view.paused:
            continue  # held back on purpose (cairnq_queue pause), not stuck
        waited = format_duration(q.oldest_due_age_ms)
        if not view.live_workers_for(q.queue):
            found.append(
                f"Queue {q.queue!r} has {q.counts['queued']} queued task(s), the oldest due "
                f"{waited} ago, and no live worker serves it."
            )
        elif q.oldest_due_age_ms > max_age_ms:
            found.append(
                f"Queue {q.queue!r}: the oldest due task has waited {waited}, longer than "
                f"{format_duration(max_age_ms)}."
            )
    return found


def check(
    using: str | None = None, *, max_age_ms: int, queues: Sequence[str] | None = None
) -> Health:
    """Read the queue once and judge it; an unreachable database is a problem too."""
    using = using or get_store().using
    try:
        connections[using].ensure_connection()
    except DatabaseError as exc:
        return Health(UNREACHABLE, (f"The queue's database is unreachable: {first_line(exc)}",))
    missing = known_missing_tables(using)
    if missing:
        return Health(UNHEALTHY, (str(TablesMissing(using, missing)),))
    try:
        view = overview(using)
    except (DatabaseError, CairnQError) as exc:
        # Reachable, the tables there, yet unreadable (another protocol version, say).
        return Health(UNHEALTHY, (f"Reading the queue failed: {first_line(exc)}",))
    found = problems(view, max_age_ms=max_age_ms, queues=queues)
    try:
        found += unhandled_problems(using, view, queues=queues)
    except (DatabaseError, CairnQError) as exc:
        found.append(f"Reading the queue failed: {first_line(exc)}")
    return Health(UNHEALTHY if found else HEALTHY, tuple(found))


def unhandled_problems(
    using: str, view: Overview, *, queues: Sequence[str] | None = None
) -> list[str]:
    """One sentence per due task name that no live worker serving its queue handles.

    Only queues some live worker serves: for the others "no live worker serves
    it" already says more. See unhandled.py for when a name counts.
    """
    served = [
        q.queue for q in view.queues
        if (not queues or q.queue in queues) and q.oldest_due_age_ms is not None
        and view.live_workers_for(q.queue)
    ]
    if not served:
        return []
    found = unhandled_names(
        using, served, now_ms=view.now_ms,
        min_wait_ms=GONE_AFTER_INTERVALS * cairnq_settings.WORKER_REPORT_INTERVAL,
        registered=registered_names(w.record for w in view.workers if w.live),
    )
    return [
        f"Queue {item.queue!r} has {item.count} due task(s) named {item.name!r}, the oldest "
        f"due {format_duration(item.oldest_due_age_ms)} ago, and no live worker has a "
        "handler for that name."
        for item in found
    ]
