"""What the fleet's flow limits count: running tasks, starts in each rate window, due tasks.

Read under the claim's lock by the limited claim (limited_claim.py) and
without it by the usage report (flow/limits.py, `limit_usage`): both count
with these queries and judge fullness with `Limit.room`. What runs is
counted from the task rows (running under an unexpired lease), so a task
whose worker died stops counting when its lease runs out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Min, QuerySet

from ..db.expressions import now_minus
from ..db.querysets import TaskQuerySet
from ..models import FlowStart
from ..records import Limit
from .protocol_statements import paused_queues_of, tasks_of

# Each limit scope and the task column (through the join, for the key) its values are in.
SCOPE_COLUMNS = {"queue": "queue", "name": "name", "key_prefix": "flow__concurrency_key"}


@dataclass
class Counts:
    """Running tasks and starts in the window, per limited scope, at one instant."""

    now: int
    # Running (unexpired lease), by scope: by queue, by name, by concrete concurrency key.
    by_scope: dict[str, dict[str, int]] = field(
        default_factory=lambda: {scope: {} for scope in SCOPE_COLUMNS}
    )
    # Per rate limit (by its index in the limits list): starts in its window
    # and the oldest of them, by value (the queue, the name, or the concrete key).
    starts: dict[int, dict[str, int]] = field(default_factory=dict)
    oldest: dict[int, dict[str, int]] = field(default_factory=dict)

    def running(self, limit: Limit, value: str) -> int:
        # Any scope but a queue's or a name's counts by key, as Limit.applies_to matches.
        return self.by_scope.get(limit.scope, self.by_scope["key_prefix"]).get(value, 0)

    def add_running(self, queue: str, name: str, key: str | None, n: int = 1) -> None:
        """Count `n` more running tasks of this queue, name and key (None: no key)."""
        for scope, value in zip(SCOPE_COLUMNS, (queue, name, key), strict=True):
            if value is not None:
                table = self.by_scope[scope]
                table[value] = table.get(value, 0) + n

    def room(self, index: int, limit: Limit, value: str) -> int:
        """How many more of `value`'s tasks may start now under limits[index]."""
        return limit.room(self.running(limit, value), self.starts.get(index, {}).get(value, 0))


def scope_value(limit: Limit, queue: str, name: str, key: str | None) -> str | None:
    """The value a task counts under for `limit` (its queue, name or key), None if it does not apply."""
    if not limit.applies_to(queue=queue, name=name, concurrency_key=key):
        return None
    return queue if limit.scope == "queue" else name if limit.scope == "name" else key


def due_tasks(using: str, now: int) -> TaskQuerySet:
    """Queued tasks due at `now` outside paused queues, any queue: what a limit could hold back."""
    return tasks_of(using).due(now).exclude(queue__in=paused_queues_of(using))


def count_queries(
    using: str, limits: Sequence[Limit], now: int | None
) -> list[tuple[int | None, QuerySet[Any, Any]]]:
    """The reads of read_counts: (None, running tasks grouped), then (index, its starts) per rate limit.

    `now` None reads the clock in SQL (NowMs), for statements sent before it is known.
    """
    queries: list[tuple[int | None, QuerySet[Any, Any]]] = []
    if any(limit.concurrency is not None for limit in limits):
        queries.append((None, tasks_of(using).holding_slot(now).order_by().values_list(
            *SCOPE_COLUMNS.values()
        ).annotate(n=Count("pk"))))
    for index, limit in enumerate(limits):
        if limit.rate is None or limit.per_ms is None:
            continue
        since = now_minus(limit.per_ms) if now is None else now - limit.per_ms
        log = FlowStart.objects.using(using).filter(scope=limit.scope, started_at_ms__gt=since)
        if limit.scope == "key_prefix":
            # LIKE is case-insensitive on SQLite: add_rows checks the prefix again.
            log = log.filter(value__startswith=limit.value)
        else:
            log = log.filter(value=limit.value)
        queries.append((index, log.order_by().values_list("value").annotate(
            n=Count("pk"), first=Min("started_at_ms")
        )))
    return queries


def add_rows(counts: Counts, limits: Sequence[Limit], index: int | None, rows: Sequence[Any]) -> None:
    """Add one count_queries read's rows (`index` as it paired them) to `counts`."""
    if index is None:
        for queue, name, key, n in rows:
            counts.add_running(queue, name, key, n)
        return
    starts: dict[str, int] = {}
    oldest: dict[str, int] = {}
    counts.starts[index], counts.oldest[index] = starts, oldest
    for value, n, first in rows:
        if value.startswith(limits[index].value):
            starts[value], oldest[value] = n, first


def read_counts(using: str, limits: Sequence[Limit], now: int) -> Counts:
    """Running tasks per queue, name and key, and each rate limit's starts in its window at `now`.

    One grouped read of the running tasks (bounded by what the fleet runs),
    and one read of the start log per rate limit.
    """
    counts = Counts(now)
    for index, query in count_queries(using, limits, now):
        add_rows(counts, limits, index, list(query))
    return counts
