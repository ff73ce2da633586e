"""Flow limits and their use as people and scrapers read them.

One reading of flow/limits.py's limit_usage() in the shape `cairnq_status`,
`cairnq_queue limits`, the admin dashboard and the Prometheus gauges all
show, so the four never disagree on what a limit is using.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from ..flow.limits import Limit, LimitUsage, limit_usage
from ..humanize import text_table
from ..store import get_store

SCOPE_LABELS = {"queue": "queue", "name": "task name", "key_prefix": "key prefix"}
_PERIOD_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))


def period_text(ms: int) -> str:
    """A rate's period in the largest whole unit: '1s', '15m', '1h', '250ms' (as --per reads it)."""
    for unit, size in _PERIOD_UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def limit_text(limit: Limit) -> str:
    """What the limit allows: '3 running', '1 running per key', '20 starts per 1s', or both."""
    per_key = " per key" if limit.scope == "key_prefix" else ""
    parts = []
    if limit.concurrency is not None:
        parts.append(f"{limit.concurrency} running{per_key}")
    if limit.rate is not None and limit.per_ms is not None:
        parts.append(f"{limit.rate} starts per {period_text(limit.per_ms)}{per_key}")
    return ", ".join(parts) or "no limit"


def running_text(usage: LimitUsage, busiest: dict[str, str] | None = None) -> str:
    """'2/3'; for a key prefix the busiest key's count, which key, and how many are full:
    "1/1 (account:7), 20 keys at the limit"."""
    limit = usage.limit
    text = f"{usage.running}" if limit.concurrency is None else f"{usage.running}/{limit.concurrency}"
    if limit.scope == "key_prefix":
        key = (busiest or {}).get(limit.value)
        if key is not None:
            text += f" ({key})"
        text += f", {usage.keys_at_limit} keys at the limit"
    return text


def starts_text(usage: LimitUsage) -> str:
    """'12/20 in 1s' (the busiest key's, for a key prefix), or '-' without a rate."""
    limit = usage.limit
    if limit.rate is None or limit.per_ms is None:
        return "-"
    return f"{usage.starts_in_window}/{limit.rate} in {period_text(limit.per_ms)}"


def usage_row(usage: LimitUsage, busiest: dict[str, str] | None = None) -> dict[str, Any]:
    """One limit and its use as plain JSON values; `busiest` is busiest_keys()' answer."""
    limit = usage.limit
    key_prefix = limit.scope == "key_prefix"
    return {
        "scope": limit.scope,
        "value": limit.value,
        "source": limit.source,
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "per_ms": limit.per_ms,
        "limit": limit_text(limit),
        # For a key_prefix limit: the busiest key's running tasks and starts.
        "running": usage.running,
        "keys_at_limit": usage.keys_at_limit if key_prefix else None,
        "busiest_key": (busiest or {}).get(limit.value) if key_prefix else None,
        "starts_in_window": usage.starts_in_window if limit.rate is not None else None,
        "held": usage.held,
    }


def busiest_keys(using: str | None, usages: list[LimitUsage]) -> dict[str, str]:
    """Per key_prefix limit's prefix, the concurrency key with the most tasks holding a slot.

    limit_usage() counts the busiest key's tasks; this names it. One grouped
    read of the running tasks that have a key (bounded by what the fleet
    runs), only when a key_prefix limit is in force. Ties go to the
    smallest key, so the answer does not flicker between equals.
    """
    prefixes = [u.limit.value for u in usages if u.limit.scope == "key_prefix"]
    if not prefixes:
        return {}
    store = get_store(using)
    rows = (
        store.tasks().holding_slot(store.clock_ms())
        .filter(flow__concurrency_key__isnull=False).order_by()
        .values_list("flow__concurrency_key").annotate(n=Count("pk"))
    )
    best: dict[str, tuple[int, str]] = {}
    for key, n in rows:
        for prefix in prefixes:
            # startswith in Python: SQLite's LIKE would ignore case.
            if key.startswith(prefix) and (-n, key) < best.get(prefix, (1, "")):
                best[prefix] = (-n, key)
    return {prefix: key for prefix, (_, key) in best.items()}


def limit_rows(using: str | None = None) -> list[dict[str, Any]]:
    """Every limit in force with its use now (limit_usage's order: settings first)."""
    usages = limit_usage(using=using)
    busiest = busiest_keys(using, usages)
    return [usage_row(usage, busiest) for usage in usages]


def limits_table(usages: list[LimitUsage], busiest: dict[str, str] | None = None) -> list[str]:
    """The limits as an aligned text table, one line per limit after the header.

    RUNNING is the busiest key's, for a key prefix (named in brackets).
    """
    header = ["SCOPE", "VALUE", "SOURCE", "LIMIT", "RUNNING", "STARTS", "HELD"]
    rows = [
        [SCOPE_LABELS[u.limit.scope], u.limit.value, u.limit.source, limit_text(u.limit),
         running_text(u, busiest), starts_text(u), str(u.held)]
        for u in usages
    ]
    return text_table(header, rows)
