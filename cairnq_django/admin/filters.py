"""The task list's queue and name filters, whose choices come from the index."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..models import Task
from ..store.admin_reads import distinct_task_values


class DistinctValueFilter(admin.SimpleListFilter):
    """Filter on one indexed text column, offering at most MAX_CHOICES of its values.

    The choices come from a skip-scan of the column's index (see
    store.admin_reads.distinct_task_values), not a DISTINCT over the table.
    """

    column: str = ""
    MAX_CHOICES = 50

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]
    ) -> list[tuple[Any, str]]:
        values = distinct_task_values(
            model_admin.using, self.column, self.MAX_CHOICES  # type: ignore[attr-defined]
        )
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(value, value) for value in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        if self.value():
            return queryset.filter(**{self.column: self.value()})
        return queryset


class QueueFilter(DistinctValueFilter):
    title = _("queue")
    parameter_name = column = "queue"


class NameFilter(DistinctValueFilter):
    title = _("name")
    parameter_name = column = "name"
