"""The task list's paging and sorting, shaped for a table of millions of rows.

Page counts stop at a bound (BoundedCountPaginator), the list sorts only by
columns an index serves, and each page's keys come with one query.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import cached_property

from ..flow.snoozes import snoozes_of
from ..models import Task, TaskKey
from ..store.admin_reads import estimated_task_count
from ..store.django_private import is_filtered, is_sliced


class BoundedCountPaginator(Paginator):
    """A paginator that never counts more than COUNT_LIMIT rows.

    Past the limit the count is an estimate: the planner's row count for the
    whole table where the database keeps one and nothing filters the list,
    otherwise the limit itself (so deep pages of a large filtered list are
    reached by narrowing the filter, not by paging).
    """

    COUNT_LIMIT = 10_000
    count_is_exact = True
    count_is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset = cast("QuerySet[Task]", self.object_list)
        counted = queryset.order_by()[: self.COUNT_LIMIT + 1].count()
        if counted <= self.COUNT_LIMIT:
            return counted
        self.count_is_exact = False
        estimate = 0 if is_filtered(queryset) else (estimated_task_count(queryset.db) or 0)
        if estimate > self.COUNT_LIMIT:
            self.count_is_estimate = True
            return estimate
        return self.COUNT_LIMIT


class TaskChangeList(ChangeList):
    """Sort only by sortable columns; attach each listed task's keys and snooze count per page."""

    MAX_ORDER_TERMS = 4

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Task]) -> list[Any]:
        # Django sorts by any column whose index is in ?o=; keep only the
        # columns in sortable_by, whose order an index serves.
        if ORDER_VAR in self.params:
            sortable = {
                index for index, name in enumerate(self.list_display) if name in (self.sortable_by or ())
            }
            kept: list[str] = []
            for part in str(self.params[ORDER_VAR]).split("."):
                _none, _prefix, index = part.rpartition("-")
                try:
                    if int(index) in sortable and part not in kept:
                        kept.append(part)
                except ValueError:
                    continue
            if kept:
                self.params[ORDER_VAR] = ".".join(kept[: self.MAX_ORDER_TERMS])
            else:
                del self.params[ORDER_VAR]
        return super().get_ordering(request, queryset)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        results: Any = self.result_list
        if not is_sliced(results):
            # A one-page result comes unsliced. A LIMIT that cuts nothing
            # still matters: without one SQLite answers "ORDER BY rowid" with
            # a full table scan instead of the filter's index.
            results = results[: max(self.list_per_page, self.list_max_show_all)]
        tasks: list[Task] = list(results)
        self.result_list = tasks
        by_task: dict[str, list[str]] = {}
        if tasks:
            ids = [task.pk for task in tasks]
            keys = TaskKey.objects.using(self.queryset.db).filter(task_id__in=ids)
            for task_id, key in keys.values_list("task_id", "key"):
                by_task.setdefault(task_id, []).append(key)
        for task in tasks:
            task.cq_keys = sorted(by_task.get(task.pk, []))  # type: ignore[attr-defined]
        snoozes = snoozes_of(self.queryset.db, [task.pk for task in tasks])
        for task in tasks:
            task.cq_snoozes = snoozes.get(task.pk, 0)  # type: ignore[attr-defined]
