"""Reading snooze counts (the store's snooze() writes them, in its requeue's transaction)."""

from __future__ import annotations

from collections.abc import Sequence

from ..models import TaskFlow


def snoozes_of(using: str, task_ids: Sequence[str]) -> dict[str, int]:
    """{task id: times snoozed} for those of `task_ids` ever snoozed; one query."""
    if not task_ids:
        return {}
    rows = TaskFlow.objects.using(using).filter(task_id__in=list(task_ids))
    return dict(rows.values_list("task_id", "snoozes"))
