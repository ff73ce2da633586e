"""The admin's dashboard: throughput over the last hour, the queues, the flow limits, the workers.

The chart is SVG drawn on the server (no JavaScript library), and the page
reloads itself every REFRESH_S seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.contrib.admin.utils import quote
from django.db.models import Count, F, Value
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ...humanize import human_duration, progress_percent, valid_progress
from ...models import Task
from ...observability.flow import SCOPE_LABELS, period_text, usage_row
from ...observability.overview import Overview, overview
from ...records import STATUSES, TERMINAL_STATUSES
from ..guarded import TaskAdminBase
from .stats import queue_row

MINUTE_MS = 60_000
MINUTES = 60
REFRESH_S = 5
# The badge colours of admin.css, so the chart and the tables agree.
COLOURS = {"succeeded": "#2e7d32", "failed": "#c62828", "canceled": "#8d6e63"}


@dataclass(frozen=True)
class Throughput:
    """Tasks finished per minute and status; minute 0 is the oldest of the window."""

    since_ms: int
    per_minute: dict[str, list[int]]

    @property
    def total(self) -> dict[str, int]:
        return {status: sum(counts) for status, counts in self.per_minute.items()}


def throughput(using: str, now_ms: int, minutes: int = MINUTES) -> Throughput:
    """Count the last `minutes` minutes' finishes per status and minute."""
    # Whole minutes ending at the current one, so the buckets do not shift each second.
    until = (now_ms // MINUTE_MS + 1) * MINUTE_MS
    since = until - minutes * MINUTE_MS
    per_minute = {status: [0] * minutes for status in TERMINAL_STATUSES}
    rows = (
        Task.objects.using(using)
        # Served by the (status, completed_at_ms) index, one range per status.
        .terminal().filter(completed_at_ms__gte=since)
        .values("status", minute=(F("completed_at_ms") - Value(since)) / Value(MINUTE_MS))
        .annotate(n=Count("id"))
        .order_by()
    )
    for row in rows:
        minute = int(row["minute"])
        if 0 <= minute < minutes:
            per_minute[row["status"]][minute] += row["n"]
    return Throughput(since_ms=since, per_minute=per_minute)


def chart_svg(data: Throughput, *, width: int = 720, height: int = 220) -> SafeString:
    """Draw one line per finished status over the window, with axes and a legend."""
    left, right, top, bottom = 44, 12, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    minutes = len(next(iter(data.per_minute.values())))
    peak = max([1, *(max(c) for c in data.per_minute.values())])
    # A round ceiling for the y axis: 1, 2, 5 × 10^n.
    scale = next(s for s in _nice_steps() if s >= peak)

    def x(i: float) -> str:
        return f"{left + plot_w * (i + 0.5) / minutes:.1f}"

    def y(n: float) -> str:
        return f"{top + plot_h * (1 - n / scale):.1f}"

    levels = sorted({0, scale // 2, scale}) if scale > 1 else [0, 1]
    grid = format_html_join(
        "",
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="cq-grid"/>'
        '<text x="{}" y="{}" class="cq-axis" text-anchor="end" dominant-baseline="middle">'
        "{}</text>",
        ((left, y(v), left + plot_w, y(v), left - 6, y(v), v) for v in levels),
    )
    ticks = format_html_join(
        "",
        '<text x="{}" y="{}" class="cq-axis" text-anchor="middle">{}</text>',
        ((x(i), height - 8, label) for i, label in _x_labels(minutes)),
    )
    lines = format_html_join(
        "",
        '<polyline points="{}" fill="none" stroke="{}" stroke-width="2" '
        'class="cq-line cq-line-{}"><title>{}</title></polyline>',
        (
            (
                " ".join(f"{x(i)},{y(n)}" for i, n in enumerate(counts)),
                COLOURS[status], status,
                _("%(status)s: %(count)d in the last hour")
                % {"status": status, "count": sum(counts)},
            )
            for status, counts in data.per_minute.items()
        ),
    )
    label = _("Tasks finished per minute over the last hour: %(totals)s.") % {
        "totals": ", ".join(f"{s} {n}" for s, n in data.total.items())
    }
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" id="cq-throughput" viewBox="0 0 {} {}" '
        'width="{}" height="{}" role="img" aria-label="{}">{}{}{}</svg>',
        width, height, width, height, label, grid, ticks, lines,
    )


def _nice_steps() -> Iterator[int]:
    magnitude = 1
    while True:
        for step in (1, 2, 5):
            yield step * magnitude
        magnitude *= 10


def _x_labels(minutes: int) -> Iterator[tuple[int, str]]:
    for i in range(0, minutes, 10):
        yield i, f"-{minutes - i} min"
    yield minutes - 1, _("now")


def dashboard_view(model_admin: TaskAdminBase, request: HttpRequest) -> TemplateResponse:
    """Render the dashboard for users who may view tasks."""
    model_admin.require_view_permission(request)
    opts = model_admin.opts
    view = overview(model_admin.using)
    data = throughput(model_admin.using, view.now_ms)
    context = {
        "title": _("Task queue dashboard"),
        "refresh_s": REFRESH_S,
        "chart": chart_svg(data),
        "legend": [(s, COLOURS[s], n) for s, n in data.total.items()],
        "statuses": STATUSES,
        "queues": _queue_rows(model_admin, view),
        "workers": _worker_rows(model_admin, view),
        "live_workers": sum(w.live for w in view.workers),
        "changelist_url": model_admin.changelist_url(),
        **_pause_context(request, view),
        **_limits_context(request, view),
        "workflows": _workflow_cells(view),
        "stats_url": reverse(f"admin:{opts.app_label}_{opts.model_name}_stats"),
    }
    return model_admin.render_page(
        request, f"admin/{opts.app_label}/{opts.model_name}/dashboard.html", context
    )


def _queue_rows(model_admin: TaskAdminBase, view: Overview) -> list[dict[str, Any]]:
    return [
        {
            **queue_row(model_admin, q),
            "workers": len(view.live_workers_for(q.queue)),
            "unserved": q.oldest_due_age_ms is not None and not view.live_workers_for(q.queue),
            "paused": q.queue in view.paused,
        }
        for q in view.queues
    ]


def _workflow_cells(view: Overview) -> list[tuple[str, int, str]]:
    """Workflows by state, each linked to the workflow list filtered to it."""
    url = reverse("admin:cairnq_django_workflow_changelist")
    return [(state, n, f"{url}?state__exact={state}") for state, n in view.workflows.items()]


def _pause_context(request: HttpRequest, view: Overview) -> dict[str, Any]:
    """The pause/resume buttons (they post to queue_state_admin.py), and paused queues with no task."""
    listed = {q.queue for q in view.queues}
    allowed = request.user.has_perm("cairnq_django.pause_queue")
    return {
        "can_pause": allowed,
        "pause_url": reverse("admin:cairnq_django_queuestate_pause") if allowed else None,
        "paused_queues": view.paused,
        "paused_without_tasks": [queue for queue in view.paused if queue not in listed],
    }


def _limits_context(request: HttpRequest, view: Overview) -> dict[str, Any]:
    """The flow limits' panel: each limit's use, and the set/clear form (flow_limit_admin.py)."""
    allowed = request.user.has_perm("cairnq_django.change_limits")
    rows = [
        {
            # The JSON row cairnq_queue and cairnq_status print, and what only the page shows.
            **usage_row(usage, view.busiest_keys),
            "scope_label": SCOPE_LABELS[usage.limit.scope],
            "key_prefix": usage.limit.scope == "key_prefix",
            "per": None if usage.limit.per_ms is None else period_text(usage.limit.per_ms),
            # Every slot (the busiest key's, for a prefix) in use, or the window spent.
            "slots_full": usage.limit.concurrency is not None
            and usage.running >= usage.limit.concurrency,
            "window_full": usage.limit.rate is not None
            and usage.starts_in_window >= usage.limit.rate,
        }
        for usage in view.limits
    ]
    return {
        "limits": rows,
        "limits_error": view.limits_error,
        "can_change_limits": allowed,
        "limits_url": reverse("admin:cairnq_django_flowlimit_set") if allowed else None,
        "limit_scopes": list(SCOPE_LABELS.items()),
    }


def _worker_rows(model_admin: TaskAdminBase, view: Overview) -> list[dict[str, Any]]:
    opts = model_admin.opts
    return [
        {
            "id": w.record.id,
            "host": w.record.host,
            "pid": w.record.pid,
            "queues": ", ".join(w.record.queues),
            "concurrency": w.record.concurrency,
            "version": w.record.version,
            "live": w.live,
            "seen_ago": human_duration(w.seen_ago_ms),
            "up_for": human_duration(max(0, view.now_ms - w.record.started_at_ms)),
            "done": w.record.tasks_done,
            "running": [
                {
                    "id": t.id, "name": t.name,
                    "url": reverse(
                        f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(t.id)]
                    ),
                    "percent": progress_percent(t.progress),
                    "progress_invalid": t.progress is not None and valid_progress(t.progress) is None,
                }
                for t in w.running
            ],
        }
        for w in view.workers
    ]
