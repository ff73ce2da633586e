"""The protocol's queries as Task QuerySet methods, each rule written once.

What is claimable, what has an expired lease, what is finished and what may
be purged are defined here and nowhere else: the store's statements, the
retention sweeper's dry run, the admin and the stats read through them.
Values may be plain or `Param` expressions (store/statement_cache.py caches the SQL).
Statuses are literals (LiteralIn): SQLite matches a partial index only
against a literal, and a plan that depended on a bound value is prepared
again each time the statement runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.expressions import Expression

from ..records import LIVE_STATUSES, RETRYABLE_STATUSES, TERMINAL_STATUSES
from .expressions import LiteralIn, NowMs, now_minus

CLAIM_ORDER = ("-priority", "run_at_ms", "id")


def one_of(field: str, values: Sequence[Any]) -> Q:
    """`field = x` for one value, so the planner reads the claim index in order; IN otherwise."""
    values = list(values)
    if len(values) == 1:
        return Q(**{field: values[0]})
    return Q(**{f"{field}__in": values})


class TaskQuerySet(models.QuerySet):
    def terminal(self) -> TaskQuerySet:
        """Succeeded, failed or canceled (the literal list matches the partial purge index)."""
        return self.filter(LiteralIn("status", TERMINAL_STATUSES))

    def live(self) -> TaskQuerySet:
        return self.filter(LiteralIn("status", LIVE_STATUSES))

    def retryable(self) -> TaskQuerySet:
        """Failed or canceled: what a retry may queue again."""
        return self.filter(LiteralIn("status", RETRYABLE_STATUSES))

    def queued(self) -> TaskQuerySet:
        return self.filter(LiteralIn("status", ("queued",)))

    def due(self, now: int | Expression | None = None) -> TaskQuerySet:
        """Queued with run_at_ms reached: what a claim may take (before pauses and limits)."""
        return self.queued().filter(run_at_ms__lte=now or NowMs())

    def running(self) -> TaskQuerySet:
        """Running, whatever its lease (the partial lease index needs the lease too)."""
        return self.filter(LiteralIn("status", ("running",)))

    def claimable(self, queues: Sequence[Any], names: Sequence[Any] | None = None,
                  now: int | Expression | None = None) -> TaskQuerySet:
        """Due on these queues (and names), in claim order."""
        qs = self.filter(one_of("queue", queues))
        if names is not None:
            qs = qs.filter(one_of("name", names))
        return qs.due(now).order_by(*CLAIM_ORDER)

    def expired_leases(self, now: int | Expression | None = None) -> TaskQuerySet:
        """Running with a lease that has run out (the partial lease index's rows)."""
        return self.running().filter(lease_until_ms__isnull=False, lease_until_ms__lte=now or NowMs())

    def holding_slot(self, now: int | Expression | None = None) -> TaskQuerySet:
        """Running under a lease that has not expired: what a concurrency limit counts.

        A task whose worker died stops counting when its lease runs out.
        """
        return self.running().filter(lease_until_ms__isnull=False, lease_until_ms__gt=now or NowMs())

    def owned(self, worker_id: Any, now: int | Expression | None = None) -> TaskQuerySet:
        """Running under worker_id's unexpired lease: what a settle or renewal may touch."""
        return self.running().filter(worker_id=worker_id, lease_until_ms__gt=now or NowMs())

    def purgeable(self, older_than_ms: Any = 0, *, queue: Any = None, status: Any = None,
                  name: Any = None, now: int | Expression | None = None) -> TaskQuerySet:
        """Finished over older_than_ms ago (optionally by queue, status, name)."""
        qs = self.terminal()
        for field, value in (("queue", queue), ("status", status), ("name", name)):
            if value is not None:
                qs = qs.filter(**{field: value})
        return qs.filter(
            completed_at_ms__isnull=False,
            completed_at_ms__lt=now_minus(older_than_ms) if now is None else now - older_than_ms,
        )

    def oldest_completed_first(self) -> TaskQuerySet:
        return self.order_by("completed_at_ms")

    def by_key(self, key: Any) -> TaskQuerySet:
        """The task a business key points at (through cairnq_task_keys)."""
        return self.filter(keys__key=key)

    def newest_first(self) -> TaskQuerySet:
        return self.order_by("-created_at_ms", "-id")
