"""Task names nothing handles: due rows a live worker serves the queue of but no one runs.

`enqueue("send_emial")` is accepted by design: a worker in another language
may run that name. A worker cannot run it, and claims only names it has
handlers for, so a typo would sit queued in silence. This finds such names
for the worker's periodic warning (presence.py) and for `cairnq_health`.

A name counts as unhandled on a queue when all of these hold:

- due rows of it on that queue have waited longer than `min_wait_ms` (a
  freshly enqueued task is not yet anyone's problem);
- no live worker serving that queue recorded the name among its handlers
  (the workers table, kept by every `cairnq_worker`);
- nothing held a live lease on a task of that name, or finished one, within
  RECENTLY_SERVED_MS: workers of other CairnQ implementations (the `cairnq`
  SDK, the TypeScript SDK) do not record themselves in the workers table, and
  this is how their work on the name shows.

Cheap by construction: the names queued on a queue are found by a seek per
distinct name on the claim index (queue, status, name, ...), not by reading
the backlog; only names that pass the first two tests are counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db.models import Count, Min

from ..humanize import human_duration
from ..models import Task, WorkerRecord

# Activity on a name this recent means some worker (maybe not a Django one) runs it.
RECENTLY_SERVED_MS = 600_000
# Distinct queued names looked at per queue and check, so a queue holding
# thousands of names costs a bounded number of seeks.
MAX_NAMES_PER_QUEUE = 200
# Handled names a warning lists, so a project with many handlers gets one readable line.
_NAMES_SHOWN = 8


@dataclass(frozen=True)
class UnhandledName:
    queue: str
    name: str
    count: int
    oldest_due_age_ms: int


def registered_names(workers: Iterable[WorkerRecord]) -> dict[str, set[str]]:
    """Queue -> the names the given (live) workers serving it registered."""
    by_queue: dict[str, set[str]] = {}
    for worker in workers:
        for queue in worker.queues or ():
            by_queue.setdefault(queue, set()).update(worker.names or ())
    return by_queue


def unhandled_names(
    using: str,
    queues: Sequence[str],
    *,
    now_ms: int,
    min_wait_ms: int,
    registered: dict[str, set[str]],
) -> list[UnhandledName]:
    """The unhandled (queue, name) pairs of `queues`; see the module docstring."""
    tasks = Task.objects.using(using)
    found = []
    for queue in queues:
        handled = registered.get(queue, set())
        for name in _queued_names(using, queue):
            if name in handled:
                continue
            due = tasks.filter(queue=queue, name=name).due(now_ms - min_wait_ms).aggregate(
                count=Count("id"), oldest=Min("run_at_ms")
            )
            if not due["count"] or _recently_served(using, name, now_ms):
                continue
            found.append(UnhandledName(queue, name, due["count"], now_ms - due["oldest"]))
    return found


def _queued_names(using: str, queue: str) -> list[str]:
    """The distinct names of the queue's queued rows: one index seek each."""
    rows = Task.objects.using(using).filter(queue=queue).queued()
    names: list[str] = []
    while len(names) < MAX_NAMES_PER_QUEUE:
        after = rows.filter(name__gt=names[-1]) if names else rows
        # Ordered as the claim index is (queue and status are fixed here), so
        # no planner prefers the name index and walks finished rows.
        name = (
            after.order_by("queue", "status", "name").values_list("name", flat=True).first()
        )
        if name is None:
            break
        names.append(name)
    return names


def _recently_served(using: str, name: str, now_ms: int) -> bool:
    since = now_ms - RECENTLY_SERVED_MS
    tasks = Task.objects.using(using).filter(name=name)
    running = tasks.running().filter(lease_until_ms__gt=since)
    finished = tasks.terminal().filter(worker_id__isnull=False, completed_at_ms__gte=since)
    return (running | finished).exists()


def describe(item: UnhandledName, *, handled_here: Iterable[str] = ()) -> str:
    """The worker's warning line for one unhandled name."""
    names = sorted(handled_here)
    running = ", ".join(names[:_NAMES_SHOWN]) or "(none)"
    if len(names) > _NAMES_SHOWN:
        running += f" and {len(names) - _NAMES_SHOWN} more"
    return (
        f"Task name {item.name!r} has {item.count} due task(s) on queue {item.queue!r}, "
        f"the oldest due {human_duration(item.oldest_due_age_ms)} ago, and no live worker "
        f"has a handler for it (live workers serving that queue run: {running}). Handlers "
        "are registered with @cairnq_django.task (or a Tasks-framework @task on a CairnQ "
        "backend) in an installed app's tasks.py; a typo in the enqueued name shows here "
        "too."
    )
