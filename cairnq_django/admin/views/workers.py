"""The workers table in the admin: a read-only list of live and gone workers."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet, Value
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ...conf import cairnq_settings
from ...humanize import human_duration
from ...models import Task, WorkerRecord
from ...observability.overview import database_now_ms
from ..display import time_field
from ..guarded import GuardedAdmin

RUNNING_SHOWN = 50


def worker_link(worker_id: str | None) -> str:
    """The worker id, linked to its row in the workers table while it has one."""
    if not worker_id:
        return "-"
    rows = WorkerRecord.objects.using(cairnq_settings.DATABASE)
    if not rows.filter(pk=worker_id).exists():
        return worker_id  # stopped, forgotten, or another implementation's worker
    url = reverse("admin:cairnq_django_workerrecord_change", args=[quote(worker_id)])
    return format_html('<a href="{}">{}</a>', url, worker_id)


@admin.register(WorkerRecord)
class WorkerAdmin(GuardedAdmin):
    """The workers table: each worker's row with its liveness, read-only.

    It offers no filter, so the query string may carry no lookup (see GuardedAdmin).
    """

    list_display = (
        "id", "host", "pid", "queue_list", "concurrency", "state", "last_seen", "started",
        "tasks_running", "tasks_done", "version",
    )
    search_fields = ("id", "host")
    ordering = ("host", "pid", "id")
    list_per_page = 100
    show_full_result_count = False
    fields = (*list_display[:3], "names_list", "interval", *list_display[3:], "running_tasks")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerRecord]:
        # One clock reading per request, on every row: liveness is judged
        # against the queue's clock, not this web server's.
        now = database_now_ms(self.using)
        rows: QuerySet[WorkerRecord] = super().get_queryset(request)
        return rows.annotate(cq_now=Value(now))

    @admin.display(description=_("queues"))
    def queue_list(self, worker: WorkerRecord) -> str:
        return ", ".join(worker.queues)

    @admin.display(description=_("task names"))
    def names_list(self, worker: WorkerRecord) -> str:
        return ", ".join(worker.names) or "-"

    @admin.display(description=_("state"))
    def state(self, worker: WorkerRecord) -> str:
        if worker.is_live(worker.cq_now):  # type: ignore[attr-defined]
            return format_html('<span class="cq-status cq-status-succeeded">{}</span>', _("live"))
        return format_html('<span class="cq-status cq-status-canceled">{}</span>', _("gone"))

    @admin.display(description=_("last seen"))
    def last_seen(self, worker: WorkerRecord) -> str:
        return _("%(ago)s ago") % {
            "ago": human_duration(
                max(0, worker.cq_now - worker.last_seen_ms)  # type: ignore[attr-defined]
            )
        }

    started = time_field("started_at_ms", _("started"))

    @admin.display(description=_("tasks it holds"))
    def running_tasks(self, worker: WorkerRecord) -> str:
        held = list(
            Task.objects.using(self.using)
            .running().filter(worker_id=worker.pk)
            .order_by("id")
            .values_list("id", "name")[:RUNNING_SHOWN]
        )
        if not held:
            return "-"
        return format_html(
            '<ul class="cq-children">{}</ul>',
            format_html_join(
                "", '<li><a href="{}">{}</a> {}</li>',
                (
                    (reverse("admin:cairnq_django_task_change", args=[quote(i)]), i, n)
                    for i, n in held
                ),
            ),
        )

    @admin.display(description=_("report interval"))
    def interval(self, worker: WorkerRecord) -> str:
        return human_duration(worker.interval_ms)

    class Media:
        css = {"all": ("cairnq_django/admin.css",)}
