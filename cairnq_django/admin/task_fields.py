"""The task page's read-only fields: times, family links, keys and the raw free-text columns.

Rows come from foreign writers too, so the page reads payload, metadata,
result, error and message raw (see db.expressions.RawText) and shows
what does not decode as escaped text with a note.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import ValidationError
from django.db.models import Field, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from .. import compat, jsoncodec
from ..db.dialects import RAW_TEXT_COLUMNS
from ..db.expressions import RawText
from ..flow.snoozes import snoozes_of
from ..models import Task, TaskKey
from .display import decode_raw, error_block, json_block, time_field
from .guarded import TaskAdminBase, acceptable_id
from .timeline import timeline_html
from .views.workers import worker_link

CHILDREN_SHOWN = 20


def _raw_attr(column: str) -> str:
    return f"cq_raw_{column}"



class TaskPageAdmin(TaskAdminBase):
    """The part of TaskAdmin that shows one task: its fields, read without trusting the row."""

    def _task_link(self, task_id: str | None) -> str:
        if not task_id:
            return "-"
        opts = self.opts
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(task_id)])
        return format_html('<a href="{}">{}</a>', url, task_id)

    # ------------------------------------------------------- raw free text
    def _with_raw_columns(self, queryset: QuerySet[Task]) -> QuerySet[Task]:
        return queryset.annotate(
            **{_raw_attr(column): RawText(column) for column in RAW_TEXT_COLUMNS}
        )

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Task | None:
        """The task with its free-text columns read raw; None for an id no task can have."""
        if not acceptable_id(object_id):
            return None
        field = cast(
            "Field[Any, Any]",
            self.opts.pk if from_field is None else self.opts.get_field(from_field),
        )
        queryset = self._with_raw_columns(self.get_queryset(request))
        try:
            task: Task = queryset.get(**{field.name: field.to_python(object_id)})
        except (Task.DoesNotExist, ValidationError, ValueError):
            return None
        return task

    def _raw(self, task: Task, column: str) -> Any:
        """A free-text column of `task` as RawText reads it (fetched if get_object did not)."""
        attr = _raw_attr(column)
        if not hasattr(task, attr):
            names = [_raw_attr(c) for c in RAW_TEXT_COLUMNS]
            queryset = self._with_raw_columns(Task.objects.using(self.using).filter(pk=task.pk))
            values = queryset.values(*names).first() or {}
            for name in names:
                setattr(task, name, values.get(name))
        return getattr(task, attr)

    # ---------------------------------------------------------- the layout
    def get_fieldsets(self, request: HttpRequest, obj: Task | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or self._framework_call(obj) is None:
            return fieldsets
        # A Tasks framework task: its call, readably, above the raw payload.
        return [
            (title, {**options, "fields": ("framework_call", *options["fields"])})
            if "payload_json" in options["fields"] else (title, options)
            for title, options in fieldsets
        ]

    def _framework_call(self, task: Task) -> str | None:
        if not compat.AVAILABLE:
            return None
        text, note = decode_raw(self._raw(task, "payload"))
        if text is None or note is not None:
            return None
        payload = jsoncodec.loads(text)  # never raises: a poison row stays readable
        if isinstance(payload, jsoncodec.Undecodable):
            return None
        from ..backends.results import describe_call

        call: str | None = describe_call(task.name, payload)
        return call

    # -------------------------------------------------------------- fields
    @admin.display(description=_("keys"))
    def keys_list(self, task: Task) -> str:
        return ", ".join(sorted(self._keys_of(task))) or "-"

    def _keys_of(self, task: Task) -> list[str]:
        return list(
            TaskKey.objects.using(self.using).filter(task_id=task.pk).values_list("key", flat=True)
        )

    @admin.display(description=_("snoozes"))
    def snooze_count(self, task: Task) -> str:
        return str(snoozes_of(self.using, [task.pk]).get(task.pk, 0))

    created_at = time_field("created_at_ms", _("created"))
    run_at = time_field("run_at_ms", _("run at"))
    updated = time_field("updated_at_ms", _("updated"))
    lease_until = time_field("lease_until_ms", _("lease until"))
    cancel_requested_at = time_field("cancel_requested_at_ms", _("cancel requested"))
    completed = time_field("completed_at_ms", _("completed"))

    @admin.display(description=_("worker id"))
    def worker_link(self, task: Task) -> str:
        return worker_link(task.worker_id)

    @admin.display(description=_("parent"))
    def parent_link(self, task: Task) -> str:
        return self._task_link(task.parent_id)

    @admin.display(description=_("root"))
    def root_link(self, task: Task) -> str:
        if not task.root_id:
            return "-"
        tree = self.changelist_url(root_id=task.root_id)
        if task.root_id == task.pk:
            return format_html('{} (<a href="{}">{}</a>)', _("this task"), tree, _("whole tree"))
        return format_html(
            '{} (<a href="{}">{}</a>)', self._task_link(task.root_id), tree, _("whole tree")
        )

    @admin.display(description=_("children"))
    def children(self, task: Task) -> str:
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
        more: str = ""
        if len(rows) > CHILDREN_SHOWN:
            more = format_html(
                '<li><a href="{}">{}</a></li>',
                self.changelist_url(root_id=task.root_id or task.pk, parent_id=task.pk),
                _("all children"),
            )
        return format_html('<ul class="cq-children">{}{}</ul>', items, more)

    @admin.display(description=_("correlation id"))
    def correlation_link(self, task: Task) -> str:
        if not task.correlation_id:
            return "-"
        return format_html(
            '<a href="{}">{}</a>',
            self.changelist_url(correlation_id=task.correlation_id),
            task.correlation_id,
        )

    @admin.display(description=_("message"))
    def message_text(self, task: Task) -> str:
        text, _note = decode_raw(self._raw(task, "message"))
        return "-" if text is None else text

    @admin.display(description=_("Django task"))
    def framework_call(self, task: Task) -> str:
        call = self._framework_call(task)
        return "-" if call is None else format_html("<code>{}</code>", call)

    @admin.display(description=_("payload"))
    def payload_json(self, task: Task) -> str:
        return json_block(self._raw(task, "payload"))

    @admin.display(description=_("metadata"))
    def metadata_json(self, task: Task) -> str:
        return json_block(self._raw(task, "metadata"))

    @admin.display(description=_("result"))
    def result_json(self, task: Task) -> str:
        return json_block(self._raw(task, "result"))

    @admin.display(description=_("error"))
    def error_json(self, task: Task) -> str:
        raw = self._raw(task, "error")
        if task.status == "succeeded" and raw is not None:
            # The protocol keeps the last failed attempt's error on the row;
            # it is history (the timeline below), not the task's state.
            return format_html(
                '- <span class="help">{}</span>',
                _("(the task succeeded; earlier attempts' errors are under Attempts)"),
            )
        return error_block(raw)

    @admin.display(description=_("attempts"))
    def attempt_history(self, task: Task) -> str:
        return timeline_html(self.using, task, self._raw(task, "error"))
