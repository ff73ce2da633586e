"""The Django admin for CairnQ tasks: browse, inspect, cancel, retry and purge.

The admin only presents. Every state change goes through the store (see
actions.py and views/task_page.py), and every query is shaped for a table of
millions of rows: the list is ordered newest first along an index (see
store.admin_reads.newest_first_ordering), page counts are bounded (see
changelist.BoundedCountPaginator), filter choices come from index skip-scans
(see filters.py), search is by exact value on indexed columns, and the query
string may carry only the filters the admin offers (see TaskAdmin.url_lookups).

Rows come from foreign writers too, so nothing here trusts a JSON column to
decode: the list never reads payload, metadata, result, error or message, and
the task page reads them raw (see task_fields.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET, require_POST, require_safe

from ..db.dialects import RAW_TEXT_COLUMNS
from ..humanize import human_duration
from ..ids import now_ms
from ..models import Task, TaskKey
from ..records import TERMINAL_STATUSES, attempt_label
from ..store.admin_reads import newest_first_ordering
from .actions import ACTIONS
from .changelist import BoundedCountPaginator, TaskChangeList
from .display import breakable, compact_time, progress_html, short_id, time_field
from .filters import NameFilter, QueueFilter
from .task_fields import TaskPageAdmin
from .views import task_page
from .views.dashboard import dashboard_view
from .views.stats import stats_view


@admin.register(Task)
class TaskAdmin(TaskPageAdmin):
    """The task list and task page; read-only except through the actions and buttons."""

    list_display = (
        "short_id",
        "task_name",
        "queue_name",
        "status_badge",
        "attempts",
        "progress_bar",
        "key",
        "created",
        "duration",
    )
    list_filter = (("status", admin.ChoicesFieldListFilter), QueueFilter, NameFilter)
    # The only lookups the query string may carry: the list filters' own
    # parameters, and the column lookups the task page links to (all indexed).
    # Anything else is refused with a 400 (see guarded.GuardedAdmin).
    url_lookups = frozenset(
        {"status__exact", "queue", "name", "root_id", "parent_id", "correlation_id"}
    )
    search_fields = ("id", "name", "keys__key", "correlation_id")
    search_help_text = _("Exact task id, name, key or correlation id.")
    max_search_length = None  # exact matches on indexed columns, no LIKE
    # ULIDs sort by creation time, and the primary key index serves this
    # order; the schema has no index on created_at_ms to sort by it.
    ordering = ("-id",)
    sortable_by = ("short_id", "created")
    list_per_page = 100
    list_max_show_all = 200
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = BoundedCountPaginator
    actions = ACTIONS

    readonly_fields = (
        "id",
        "name",
        "queue",
        "status_badge",
        "keys_list",
        "priority",
        "attempts",
        "snooze_count",
        "worker_link",
        "progress_bar",
        "message_text",
        "created_at",
        "run_at",
        "updated",
        "lease_until",
        "cancel_requested_at",
        "completed",
        "duration",
        "parent_link",
        "root_link",
        "children",
        "correlation_link",
        "framework_call",
        "payload_json",
        "metadata_json",
        "result_json",
        "error_json",
        "attempt_history",
    )
    fieldsets = (
        (None, {"fields": (
            "id", "name", "queue", "status_badge", "keys_list", "priority", "attempts",
            "snooze_count", "worker_link", "progress_bar", "message_text",
        )}),
        (_("Times"), {"fields": (
            "created_at", "run_at", "updated", "lease_until", "cancel_requested_at", "completed",
            "duration",
        )}),
        (_("Family"), {"fields": ("parent_link", "root_link", "children", "correlation_link")}),
        (_("Payload"), {"fields": ("payload_json", "metadata_json")}),
        (_("Outcome"), {"fields": ("result_json", "error_json")}),
        (_("Attempts"), {"fields": ("attempt_history",)}),
    )

    class Media:
        css = {"all": ("cairnq_django/admin.css",)}
        js = ("cairnq_django/copy_id.js",)

    # ------------------------------------------------------------- plumbing
    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        # The list shows none of the free-text columns, and on SQLite merely
        # selecting one that is not UTF-8 fails the page; get_object reads them.
        return super().get_queryset(request).defer(*RAW_TEXT_COLUMNS)

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        return newest_first_ordering(self.using)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[TaskChangeList]:
        return TaskChangeList

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts

        def url(route: str, view: Callable[..., HttpResponse]) -> URLPattern:
            """`view` at `route` for staff only, named admin:<app>_<model>_<the route's last part>."""
            name = f"{opts.app_label}_{opts.model_name}_{route.split('/')[-2]}"
            return path(route, self.admin_site.admin_view(view), name=name)

        # The pages are functions of (self, request, ...), each 405 for a method it does not serve.
        return [
            url("stats/", require_safe(partial(stats_view, self))),
            url("dashboard/", require_safe(partial(dashboard_view, self))),
            url("<path:object_id>/cancel/", require_POST(partial(task_page.cancel_view, self))),
            url("<path:object_id>/retry/", require_POST(partial(task_page.retry_view, self))),
            url("<path:object_id>/progress/", require_GET(partial(task_page.progress_view, self))),
            *super().get_urls(),
        ]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Task | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(task_page.controls(self, request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    # ---------------------------------------------------------------- search
    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        """Match the term exactly against id, name, correlation id or a key.

        Exact matches are index lookups; a substring search would read every row.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        keyed = list(
            TaskKey.objects.using(self.using).filter(key=term).values_list("task_id", flat=True)
        )
        match = Q(id__in=[term, *keyed]) | Q(name=term) | Q(correlation_id=term)
        return queryset.filter(match), False

    # ------------------------------------------------- list and page columns
    # The list fits a 1400 px screen beside the admin's sidebars: the id is
    # shortened (the full one on hover, and copy_id.js adds a copy button),
    # queue names stay whole, and long names and keys break only after . _ - :
    @admin.display(description=_("id"), ordering="id")
    def short_id(self, task: Task) -> str:
        return format_html('<span class="cq-id" title="{}">{}</span>', task.pk, short_id(task.pk))

    @admin.display(description=_("queue"))
    def queue_name(self, task: Task) -> str:
        return format_html('<span class="cq-queue" title="{}">{}</span>', task.queue, task.queue)

    @admin.display(description=_("name"))
    def task_name(self, task: Task) -> str:
        return breakable(task.name)

    @admin.display(description=_("status"))
    def status_badge(self, task: Task) -> str:
        label = task.status
        css = f"cq-status cq-status-{task.status}"
        if task.status == "running" and task.cancel_requested_at_ms is not None:
            label = str(_("running, cancel requested"))
            css += " cq-status-cancel-requested"
        return format_html('<span class="{}">{}</span>', css, label)

    @admin.display(description=_("attempt"))
    def attempts(self, task: Task) -> str:
        label = attempt_label(task.attempt, task.max_attempts)
        # The change list attaches the page's snooze counts (changelist.py).
        snoozes = getattr(task, "cq_snoozes", 0)
        if not snoozes:
            return label
        # The count goes under the attempt (admin.css): on one line the column is too wide
        # for a 1,400 px window beside Django 6.1's sidebars.
        return format_html('{} <span class="cq-snoozes">{} snoozed</span>', label, snoozes)

    @admin.display(description=_("progress"))
    def progress_bar(self, task: Task) -> str:
        if task.status != "running":
            return "-"
        return progress_html(task.progress)

    @admin.display(description=_("key"))
    def key(self, task: Task) -> str:
        keys = getattr(task, "cq_keys", None)
        if keys is None:
            keys = sorted(self._keys_of(task))
        return format_html_join(", ", "{}", ((breakable(key),) for key in keys)) or "-"

    created = time_field("created_at_ms", _("created"), compact_time, "id")

    @admin.display(description=_("duration"))
    def duration(self, task: Task) -> str:
        """Enqueue to finish for finished tasks (the schema records no start time)."""
        if task.completed_at_ms is None:
            if task.status in TERMINAL_STATUSES:
                return "-"
            return format_html(
                '<span class="cq-age" title="{}">{}</span>',
                _("age so far"),
                human_duration(max(0, now_ms() - task.created_at_ms)),
            )
        return human_duration(max(0, task.completed_at_ms - task.created_at_ms))
