"""Retention rules: what a rule deletes, what a sweep did with it, and one-off narrowing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .durations import format_compact_duration


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionRule:
    """Finished tasks matching the filters may be deleted older_than_ms after completion."""

    older_than_ms: int
    queue: str | None = None
    status: str | None = None  # None means every finished status
    name: str | None = None

    def purge_filters(self) -> dict[str, Any]:
        """This rule as the filters of the store's purge() and count_purgeable(): its fields."""
        return asdict(self)

    def describe(self, count: int | None = None) -> str:
        """Say in words what this rule deletes; `count` (if given) picks task or tasks."""
        noun = "task" if count == 1 else "tasks"
        what = f"{self.status} {noun}" if self.status else f"finished {noun}"
        if self.queue is not None:
            what += f" in queue {self.queue!r}"
        if self.name is not None:
            what += f" named {self.name!r}"
        return f"{what} older than {format_compact_duration(self.older_than_ms)}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleResult:
    """What one sweep did for one rule (or, in a dry run, would do)."""

    rule: RetentionRule
    deleted: int  # in a dry run: how many rows match now
    batches: int  # purge statements that deleted rows (0 in a dry run)
    dry_run: bool = False
    complete: bool = True  # False when stop() cut the sweep short

    @property
    def description(self) -> str:
        """The rule in words, with "task" or "tasks" agreeing with `deleted`."""
        return self.rule.describe(self.deleted)


def rules_for_overrides(
    rules: Sequence[RetentionRule],
    *,
    older_than_ms: int | None = None,
    statuses: Sequence[str] = (),
    queues: Sequence[str] = (),
    names: Sequence[str] = (),
) -> list[RetentionRule]:
    """Return one-off rules: a new cutoff for the given filters, or `rules` narrowed to them.

    With older_than_ms, every combination of the filters becomes a rule with
    that cutoff. Without it, each configured rule is intersected with each
    combination, so a narrowed sweep never deletes more than the settings allow.
    """
    combos = [
        (s, q, n) for s in _or_any(statuses) for q in _or_any(queues) for n in _or_any(names)
    ]
    if older_than_ms is not None:
        return [
            RetentionRule(older_than_ms=older_than_ms, status=s, queue=q, name=n)
            for s, q, n in combos
        ]
    narrowed: list[RetentionRule] = []
    for rule in rules:
        for s, q, n in combos:
            merged: dict[str, str | None] = {}
            for field, want in (("status", s), ("queue", q), ("name", n)):
                have = getattr(rule, field)
                if want is not None and have is not None and want != have:
                    break
                merged[field] = have if have is not None else want
            else:
                candidate = RetentionRule(older_than_ms=rule.older_than_ms, **merged)
                if candidate not in narrowed:
                    narrowed.append(candidate)
    return narrowed


def _or_any(values: Sequence[str]) -> list[str | None]:
    """The values to filter on, or [None] (match any) when there are none."""
    return [*values] or [None]
