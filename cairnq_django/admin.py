"""The Django admin for CairnQ tasks: browse, inspect, cancel, retry and purge.

The admin only presents. Every state change goes through the store (see
admin_actions.py), and every query is shaped for a table of millions of rows:
the list is ordered newest first along an index (the primary key, a ULID; the
rowid on SQLite), page counts are bounded (see BoundedCountPaginator), filter choices come from
index skip-scans, search is by exact value on indexed columns, and the query string may carry
only the filters the admin offers (see TaskAdmin.url_lookups).

Rows come from foreign writers too, so nothing here trusts a JSON column to
decode: the list never reads payload, metadata, result, error or message, and
the task page reads them as raw text (see raw_column) and shows what does not
decode as escaped text with a note.
"""

from __future__ import annotations

import json

from django.contrib import admin
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.contrib.auth import get_permission_codename
from django.core.exceptions import BadRequest, ValidationError
from django.core.paginator import Paginator
from django.db.models import Q
from django.urls import path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from . import admin_actions, admin_dashboard, admin_task_page, admin_views, admin_workers, compat, jsoncodec
from .admin_views import format_duration, format_time, ms_to_datetime
from .conf import cairnq_settings
from .ids import now_ms
from .models import Task, TaskKey
from .records import TERMINAL_STATUSES
from .store.admin_reads import (
    distinct_task_values,
    estimated_task_count,
    newest_first_ordering,
    raw_column,
)

CHILDREN_SHOWN = 20

# Columns a foreign writer fills with free text: the list never selects them,
# and the task page reads them through raw_column.
RAW_COLUMNS = ("payload", "metadata", "result", "error", "message")


def _raw_attr(column: str) -> str:
    return f"cq_raw_{column}"


def _decode_raw(raw) -> tuple[str | None, str | None]:
    """Return (text, note): the raw value as text, and why it is not valid if it is not."""
    if raw is None:
        return None, None
    if isinstance(raw, memoryview):
        raw = bytes(raw)
    if isinstance(raw, (bytes, bytearray)):
        try:
            return bytes(raw).decode(), None
        except UnicodeDecodeError:
            return bytes(raw).decode(errors="replace"), _(
                "This is not valid JSON: the stored text is not valid UTF-8 (undecodable bytes"
                " are shown as U+FFFD)."
            )
    return str(raw), None


def _pretty_json(text: str) -> str | None:
    """Pretty-print JSON text, or None if Python's decoder (or encoder) refuses it."""
    try:
        value = json.loads(text)
        pretty = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None
    try:
        pretty.encode()
    except UnicodeEncodeError:
        # A string holding an unpaired surrogate: valid JSON, but not writable
        # as UTF-8, so spell it with escapes.
        pretty = json.dumps(value, indent=2, sort_keys=True)
    return pretty


def _json_block(raw) -> str:
    """Render a JSON column read through raw_column; never raises on what the row holds."""
    text, note = _decode_raw(raw)
    if text is None:
        return "-"
    pretty = None if note else _pretty_json(text)
    # format_html escapes the text, so a payload cannot inject markup.
    if pretty is not None:
        return format_html('<pre class="cq-json">{}</pre>', pretty)
    if note is None:
        note = _(
            "This is not valid JSON to Python's decoder (malformed, or nested too deeply);"
            " shown as stored."
        )
    return format_html(
        '<p class="help cq-json-invalid">{}</p><pre class="cq-json cq-json-raw">{}</pre>',
        note,
        text,
    )


class BoundedCountPaginator(Paginator):
    """A paginator that never counts more than COUNT_LIMIT rows.

    Past the limit the count is an estimate: the planner's row count for the
    whole table on PostgreSQL when nothing filters the list, otherwise the limit
    itself (so deep pages of a large filtered list are reached by narrowing the
    filter, not by paging).
    """

    COUNT_LIMIT = 10_000
    count_is_exact = True
    count_is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        counted = queryset.order_by()[: self.COUNT_LIMIT + 1].count()
        if counted <= self.COUNT_LIMIT:
            return counted
        self.count_is_exact = False
        estimate = 0 if queryset.query.where else (estimated_task_count(queryset.db) or 0)
        if estimate > self.COUNT_LIMIT:
            self.count_is_estimate = True
            return estimate
        return self.COUNT_LIMIT



class TaskChangeList(ChangeList):
    """Sort only by sortable columns; attach each listed task's keys with one query per page."""

    MAX_ORDER_TERMS = 4

    def get_ordering(self, request, queryset):
        # Django sorts by any column whose index is in ?o=; keep only the
        # columns in sortable_by, whose order an index serves.
        if ORDER_VAR in self.params:
            sortable = {
                index for index, name in enumerate(self.list_display) if name in self.sortable_by
            }
            kept = []
            for part in self.params[ORDER_VAR].split("."):
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

    def get_results(self, request):
        super().get_results(request)
        if not self.result_list.query.is_sliced:
            # A one-page result comes unsliced. A LIMIT that cuts nothing
            # still matters: without one SQLite answers "ORDER BY rowid" with
            # a full table scan instead of the filter's index.
            self.result_list = self.result_list[: max(self.list_per_page, self.list_max_show_all)]
        self.result_list = list(self.result_list)
        by_task: dict[str, list[str]] = {}
        if self.result_list:
            ids = [task.pk for task in self.result_list]
            keys = TaskKey.objects.using(self.queryset.db).filter(task_id__in=ids)
            for task_id, key in keys.values_list("task_id", "key"):
                by_task.setdefault(task_id, []).append(key)
        for task in self.result_list:
            task.cq_keys = sorted(by_task.get(task.pk, []))


class DistinctValueFilter(admin.SimpleListFilter):
    """Filter on one indexed text column, offering at most MAX_CHOICES of its values.

    The choices come from a skip-scan: each step asks the index for the next
    value greater than the last, so a million rows with five queues cost five
    index probes instead of a DISTINCT over the table.
    """

    column: str = ""
    MAX_CHOICES = 50

    def lookups(self, request, model_admin):
        values = distinct_task_values(model_admin.using, self.column, self.MAX_CHOICES)
        current = self.value()
        if current and current not in values:
            values.append(current)
        return [(value, value) for value in values]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(**{self.column: self.value()})
        return queryset


class QueueFilter(DistinctValueFilter):
    title = _("queue")
    parameter_name = column = "queue"


class NameFilter(DistinctValueFilter):
    title = _("name")
    parameter_name = column = "name"


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "queue",
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
    # Anything else is refused with a 400 (see lookup_allowed).
    url_lookups = frozenset(
        {"status__exact", "queue", "name", "root_id", "parent_id", "correlation_id"}
    )
    search_fields = ("id", "name", "keys__key", "correlation_id")
    search_help_text = _("Exact task id, name, key or correlation id.")
    # ULIDs sort by creation time, and the primary key index serves this
    # order; the schema has no index on created_at_ms to sort by it.
    ordering = ("-id",)
    sortable_by = ("id", "created")
    list_per_page = 100
    list_max_show_all = 200
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = BoundedCountPaginator
    actions = admin_actions.ACTIONS

    readonly_fields = (
        "id",
        "name",
        "queue",
        "status_badge",
        "keys_list",
        "priority",
        "attempts",
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
    )
    fieldsets = (
        (None, {"fields": (
            "id", "name", "queue", "status_badge", "keys_list", "priority", "attempts",
            "worker_link", "progress_bar", "message_text",
        )}),
        (_("Times"), {"fields": (
            "created_at", "run_at", "updated", "lease_until", "cancel_requested_at", "completed",
            "duration",
        )}),
        (_("Family"), {"fields": ("parent_link", "root_link", "children", "correlation_link")}),
        (_("Payload"), {"fields": ("payload_json", "metadata_json")}),
        (_("Outcome"), {"fields": ("result_json", "error_json")}),
    )

    class Media:
        css = {"all": ("cairnq_django/admin.css",)}

    # ------------------------------------------------------------- plumbing
    @property
    def using(self) -> str:
        return cairnq_settings.DATABASE

    def get_queryset(self, request):
        # The list shows none of the free-text columns, and on SQLite merely
        # selecting one that is not UTF-8 fails the page; get_object reads them.
        return super().get_queryset(request).using(self.using).defer(*RAW_COLUMNS)

    def _with_raw_columns(self, queryset):
        return queryset.annotate(
            **{_raw_attr(column): raw_column(column, self.using) for column in RAW_COLUMNS}
        )

    def get_object(self, request, object_id, from_field=None):
        """The task with its free-text columns read raw; None for an id no task can have."""
        if "\x00" in object_id:
            # PostgreSQL refuses NUL in any text it is asked to compare.
            return None
        field = self.opts.pk if from_field is None else self.opts.get_field(from_field)
        queryset = self._with_raw_columns(self.get_queryset(request))
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (Task.DoesNotExist, ValidationError, ValueError):
            return None

    def _raw(self, task, column: str):
        """A free-text column of `task` as raw_column reads it (fetched if get_object did not)."""
        attr = _raw_attr(column)
        if not hasattr(task, attr):
            values = (
                self._with_raw_columns(Task.objects.using(self.using).filter(pk=task.pk))
                .values(*(_raw_attr(c) for c in RAW_COLUMNS))
                .first()
            ) or {}
            for name in (_raw_attr(c) for c in RAW_COLUMNS):
                setattr(task, name, values.get(name))
        return getattr(task, attr)

    def lookup_allowed(self, lookup, value, request=None):
        return lookup in self.url_lookups

    def changelist_view(self, request, extra_context=None):
        for data in (request.GET, request.POST):
            for key, values in data.lists():
                if "\x00" in key or any("\x00" in value for value in values):
                    # No task column can hold NUL on PostgreSQL, and a query
                    # that compares with one fails there.
                    raise BadRequest("The task list's parameters may not contain NUL.")
        return super().changelist_view(request, extra_context)

    def get_ordering(self, request):
        return newest_first_ordering(self.using)

    def get_changelist(self, request, **kwargs):
        return TaskChangeList

    def get_urls(self):
        opts = self.opts
        stats = self.admin_site.admin_view(admin_views.StatsView.as_view(model_admin=self))
        dashboard = self.admin_site.admin_view(
            admin_dashboard.DashboardView.as_view(model_admin=self)
        )
        return [
            path("stats/", stats, name=f"{opts.app_label}_{opts.model_name}_stats"),
            path("dashboard/", dashboard, name=f"{opts.app_label}_{opts.model_name}_dashboard"),
            *admin_task_page.urls(self),
        ] + super().get_urls()

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(admin_task_page.controls(self, request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def changelist_url(self, **params) -> str:
        opts = self.opts
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        return f"{url}?{urlencode(params)}" if params else url

    def _task_link(self, task_id: str | None):
        if not task_id:
            return "-"
        opts = self.opts
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[task_id])
        return format_html('<a href="{}">{}</a>', url, task_id)

    # ---------------------------------------------------------- permissions
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        # Rows leave only through the purge action, which keeps live tasks.
        return False

    def _has_task_permission(self, request, action: str) -> bool:
        codename = get_permission_codename(action, self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_cancel_permission(self, request):
        return self._has_task_permission(request, "cancel")

    def has_retry_permission(self, request):
        return self._has_task_permission(request, "retry")

    def has_purge_permission(self, request):
        return self._has_task_permission(request, "purge")

    # ---------------------------------------------------------------- search
    def get_search_results(self, request, queryset, search_term):
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

    # --------------------------------------------------------------- columns
    @admin.display(description=_("status"))
    def status_badge(self, task):
        label = task.status
        css = f"cq-status cq-status-{task.status}"
        if task.status == "running" and task.cancel_requested_at_ms is not None:
            label = _("running, cancel requested")
            css += " cq-status-cancel-requested"
        return format_html('<span class="{}">{}</span>', css, label)

    @admin.display(description=_("attempt"))
    def attempts(self, task):
        return f"{task.attempt}/{task.max_attempts}"

    @admin.display(description=_("progress"))
    def progress_bar(self, task):
        if task.status != "running" or task.progress is None:
            return "-"
        percent = round(task.progress * 100)
        return format_html(
            '<span class="cq-nowrap"><progress class="cq-progress" max="100" value="{}">'
            "</progress> {}%</span>",
            percent,
            percent,
        )

    @admin.display(description=_("key"))
    def key(self, task):
        keys = getattr(task, "cq_keys", None)
        if keys is None:
            keys = sorted(self._keys_of(task))
        return ", ".join(keys) or "-"

    @admin.display(description=_("keys"))
    def keys_list(self, task):
        return ", ".join(sorted(self._keys_of(task))) or "-"

    def _keys_of(self, task) -> list[str]:
        return list(
            TaskKey.objects.using(self.using).filter(task_id=task.pk).values_list("key", flat=True)
        )

    @admin.display(description=_("created"), ordering="id")
    def created(self, task):
        return ms_to_datetime(task.created_at_ms)

    @admin.display(description=_("created"))
    def created_at(self, task):
        return format_time(task.created_at_ms)

    @admin.display(description=_("duration"))
    def duration(self, task):
        """Enqueue to finish for finished tasks (the schema records no start time)."""
        if task.completed_at_ms is None:
            if task.status in TERMINAL_STATUSES:
                return "-"
            return format_html(
                '<span class="cq-age" title="{}">{}</span>',
                _("age so far"),
                format_duration(max(0, now_ms() - task.created_at_ms)),
            )
        return format_duration(max(0, task.completed_at_ms - task.created_at_ms))

    @admin.display(description=_("run at"))
    def run_at(self, task):
        return format_time(task.run_at_ms)

    @admin.display(description=_("updated"))
    def updated(self, task):
        return format_time(task.updated_at_ms)

    @admin.display(description=_("lease until"))
    def lease_until(self, task):
        return format_time(task.lease_until_ms)

    @admin.display(description=_("cancel requested"))
    def cancel_requested_at(self, task):
        return format_time(task.cancel_requested_at_ms)

    @admin.display(description=_("completed"))
    def completed(self, task):
        return format_time(task.completed_at_ms)

    @admin.display(description=_("worker id"))
    def worker_link(self, task):
        return admin_workers.worker_link(task.worker_id)

    @admin.display(description=_("parent"))
    def parent_link(self, task):
        return self._task_link(task.parent_id)

    @admin.display(description=_("root"))
    def root_link(self, task):
        if not task.root_id:
            return "-"
        tree = self.changelist_url(root_id=task.root_id)
        if task.root_id == task.pk:
            return format_html('{} (<a href="{}">{}</a>)', _("this task"), tree, _("whole tree"))
        return format_html(
            '{} (<a href="{}">{}</a>)', self._task_link(task.root_id), tree, _("whole tree")
        )

    @admin.display(description=_("children"))
    def children(self, task):
        # Children share the parent's root, so the root index finds them.
        rows = list(
            Task.objects.using(self.using)
            .filter(root_id=task.root_id or task.pk, parent_id=task.pk)
            .order_by("-id")
            .values_list("id", "name", "status")[: CHILDREN_SHOWN + 1]
        )
        if not rows:
            return "-"
        items = format_html_join(
            "", "<li>{} {} <span class='cq-status cq-status-{}'>{}</span></li>",
            ((self._task_link(i), n, s, s) for i, n, s in rows[:CHILDREN_SHOWN]),
        )
        more = ""
        if len(rows) > CHILDREN_SHOWN:
            more = format_html(
                '<li><a href="{}">{}</a></li>',
                self.changelist_url(root_id=task.root_id or task.pk, parent_id=task.pk),
                _("all children"),
            )
        return format_html('<ul class="cq-children">{}{}</ul>', items, more)

    @admin.display(description=_("correlation id"))
    def correlation_link(self, task):
        if not task.correlation_id:
            return "-"
        return format_html(
            '<a href="{}">{}</a>',
            self.changelist_url(correlation_id=task.correlation_id),
            task.correlation_id,
        )

    @admin.display(description=_("message"))
    def message_text(self, task):
        text, _note = _decode_raw(self._raw(task, "message"))
        return "-" if text is None else text

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or self._framework_call(obj) is None:
            return fieldsets
        # A Tasks framework task: its call, readably, above the raw payload.
        return [
            (title, {**options, "fields": ("framework_call", *options["fields"])})
            if "payload_json" in options["fields"] else (title, options)
            for title, options in fieldsets
        ]

    def _framework_call(self, task):
        if not compat.AVAILABLE:
            return None
        text, note = _decode_raw(self._raw(task, "payload"))
        if text is None or note is not None:
            return None
        payload = jsoncodec.loads(text)  # never raises: a poison row stays readable
        if isinstance(payload, jsoncodec.Undecodable):
            return None
        from .backends.results import describe_call

        return describe_call(task.name, payload)

    @admin.display(description=_("Django task"))
    def framework_call(self, task):
        call = self._framework_call(task)
        return "-" if call is None else format_html("<code>{}</code>", call)

    @admin.display(description=_("payload"))
    def payload_json(self, task):
        return _json_block(self._raw(task, "payload"))

    @admin.display(description=_("metadata"))
    def metadata_json(self, task):
        return _json_block(self._raw(task, "metadata"))

    @admin.display(description=_("result"))
    def result_json(self, task):
        return _json_block(self._raw(task, "result"))

    @admin.display(description=_("error"))
    def error_json(self, task):
        return _json_block(self._raw(task, "error"))


# The schedules page lives with the scheduler; importing it registers it.
from .schedules import admin as _schedules_admin  # noqa: E402,F401
