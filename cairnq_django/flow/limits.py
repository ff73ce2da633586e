"""Fleet-wide concurrency and rate limits: which are in force, changing them at run time, their use.

A limit caps the tasks of one queue, one task name, or each concurrency key
under a prefix (`enqueue(..., concurrency_key="account:42")`): at most
`concurrency` running at once, at most `rate` starts per `per_ms`. They come
from CAIRNQ["LIMITS"] (settings) and from FlowLimit rows written here at run
time; a row overrides the settings' limit on the same scope and value, and a
row with neither a concurrency nor a rate lifts it. Workers re-read them
about once a second while claiming, and claim through
store/limited_claim.py while any is in force.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Count, Q

from ..models import FlowLimit
from ..records import Limit
from ..store import get_store
from ..store.limit_counts import due_tasks, read_counts, scope_value
from .limit_parsing import LIMIT_SCOPES, check_scope, make_limit, settings_limits
from .pausing import check_by, notify_queued

__all__ = [
    "LIMIT_SCOPES",
    "Limit",
    "LimitUsage",
    "clear_limit",
    "effective_limits",
    "limit_usage",
    "runtime_limits",
    "set_limit",
    "settings_limits",
]

# The most queues one change wakes by name (PostgreSQL): a worker that misses
# the wake still sees the change within about a second.
_WAKE_QUEUES_MAX = 100


@dataclass(frozen=True)
class LimitUsage:
    """One limit in force and how much of it is used now.

    `running`: tasks in its scope running under an unexpired lease (for a
    key_prefix limit, the busiest key's count). `keys_at_limit`: key_prefix
    limits only, how many keys have all their slots (or their window) used.
    `starts_in_window`: starts in the last `per_ms` (the busiest key's, for a
    key_prefix limit). `held`: due queued tasks in its scope that this limit
    keeps from starting now.
    """

    limit: Limit
    running: int
    keys_at_limit: int
    starts_in_window: int
    held: int


def runtime_limits(using: str | None = None) -> list[Limit]:
    """The FlowLimit rows as Limits (source "runtime"), lifted ones included; one query."""
    rows = FlowLimit.objects.using(get_store(using).using).order_by("scope", "value")
    return [Limit(r.scope, r.value, r.concurrency, r.rate, r.per_ms, "runtime") for r in rows]


def effective_limits(using: str | None = None) -> list[Limit]:
    """The limits in force: the settings' ones, each replaced by a runtime row on its scope and value.

    Lifted limits (a runtime row with neither concurrency nor rate) are left
    out. Settings first, in their order, then runtime-only limits by scope
    and value.
    """
    runtime = {(limit.scope, limit.value): limit for limit in runtime_limits(using)}
    merged: list[Limit] = []
    for limit in settings_limits():
        merged.append(runtime.pop((limit.scope, limit.value), limit))
    merged.extend(runtime.values())
    return [limit for limit in merged if not limit.is_lifted]


def _wake(alias: str, limit: Limit) -> None:
    """PostgreSQL: wake idle workers of the queues the change may free, at commit."""
    store = get_store(alias)
    if not store.dialect.has_listen_notify:
        return  # SQLite: the commit changes the data_version the wakeup watches
    if limit.scope == "queue":
        queues = [limit.value]
    else:
        waiting = store.tasks().queued()
        if limit.scope == "name":
            waiting = waiting.filter(name=limit.value)
        queues = list(waiting.order_by().values_list("queue", flat=True).distinct()[:_WAKE_QUEUES_MAX])
    notify_queued(alias, queues)


def set_limit(
    scope: str,
    value: str,
    *,
    concurrency: int | None = None,
    rate: int | None = None,
    per: Any = None,
    using: str | None = None,
    by: str = "",
) -> Limit:
    """Set the runtime limit on (scope, value), overriding CAIRNQ["LIMITS"]'s; return it.

    `concurrency`: at most this many running at once (for a key_prefix
    limit, per key). `rate`: at most this many starts per `per` (a
    timedelta or ms; default one second). Neither: no limit, which lifts a
    settings limit on the same scope and value. ValueError for a bad
    argument, before anything is written. Workers apply it within about a
    second.
    """
    limit = make_limit(scope, value, concurrency=concurrency, rate=rate, per=per)
    check_by(by)
    store = get_store(using)
    with transaction.atomic(using=store.using):
        fields = {"concurrency": limit.concurrency, "rate": limit.rate, "per_ms": limit.per_ms,
                  "changed_at_ms": store.clock_ms(), "changed_by": by}
        # A caller creating the row first makes ours an update: the later write wins.
        FlowLimit.objects.using(store.using).update_or_create(scope=scope, value=value, defaults=fields)
        _wake(store.using, limit)
    return limit


def clear_limit(scope: str, value: str, *, using: str | None = None, by: str = "") -> bool:
    """Remove the runtime limit on (scope, value); True if there was one.

    The settings' limit on the same scope and value, if any, applies again.
    """
    check_scope(scope, value)
    check_by(by)
    store = get_store(using)
    with transaction.atomic(using=store.using):
        deleted, _ = FlowLimit.objects.using(store.using).filter(scope=scope, value=value).delete()
        if deleted:
            _wake(store.using, Limit(scope, value, None, None, None, "runtime"))
    return bool(deleted)


def limit_usage(using: str | None = None) -> list[LimitUsage]:
    """Each limit in force with its use now, in effective_limits() order.

    Reads what the claim reads (running tasks, the start log) plus the due
    queued tasks of the limited scopes, without taking the claim's lock: a
    snapshot for the dashboard, the status command and the metrics.
    """
    store = get_store(using)
    limits = effective_limits(store.using)
    if not limits:
        return []
    now = store.clock_ms()
    counts = read_counts(store.using, limits, now)
    due = _due_by_scope(store.using, limits, now)
    usage = []
    for index, limit in enumerate(limits):
        starts = counts.starts.get(index, {})
        if limit.scope == "key_prefix":
            keys = {key for key in counts.by_scope["key_prefix"] if key.startswith(limit.value)} | set(starts)
            keys |= {key for key in due[index] if key}
        else:
            keys = {limit.value}
        running = {key: counts.running(limit, key) for key in keys}
        held = at_limit = 0
        for key in keys:
            free = limit.room(running[key], starts.get(key, 0))
            if free <= 0:
                at_limit += 1
            held += max(0, due[index].get(key, 0) - max(free, 0))
        usage.append(LimitUsage(
            limit=limit,
            running=max(running.values(), default=0),
            keys_at_limit=at_limit if limit.scope == "key_prefix" else 0,
            starts_in_window=max(starts.values(), default=0),
            held=held,
        ))
    return usage


def _due_by_scope(using: str, limits: list[Limit], now: int) -> list[dict[str, int]]:
    """Per limit: due queued tasks (not in a paused queue) by the value they count under; one query."""
    in_scope = Q(pk__in=[])
    for limit in limits:
        if limit.scope == "queue":
            in_scope |= Q(queue=limit.value)
        elif limit.scope == "name":
            in_scope |= Q(name=limit.value)
        else:
            in_scope |= Q(flow__concurrency_key__startswith=limit.value)
    rows = (
        due_tasks(using, now).filter(in_scope).order_by()
        .values_list("queue", "name", "flow__concurrency_key").annotate(n=Count("pk"))
    )
    by_limit: list[dict[str, int]] = [{} for _ in limits]
    for queue, name, key, n in rows:
        for index, limit in enumerate(limits):
            value = scope_value(limit, queue, name, key)
            if value is not None:
                by_limit[index][value] = by_limit[index].get(value, 0) + n
    return by_limit
