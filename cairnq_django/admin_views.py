"""The admin's queue stats page: is work flowing?"""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.translation import gettext as _
from django.views import View

from .records import STATUSES, TERMINAL_STATUSES
from .store.admin_reads import queue_stats


def ms_to_datetime(ms: int | None) -> datetime | None:
    """Return an aware UTC datetime for epoch milliseconds (None stays None)."""
    if ms is None:
        return None
    # Integer arithmetic: a float division can round 455 ms down to 454.999.
    return datetime.fromtimestamp(ms // 1000, tz=UTC).replace(microsecond=ms % 1000 * 1000)


def format_time(ms: int | None) -> str:
    """Render epoch milliseconds as a local date and time to the millisecond."""
    moment = ms_to_datetime(ms)
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    text = (
        f"{dateformat.format(local, 'Y-m-d H:i:s')}.{local.microsecond // 1000:03d}"
        f" {dateformat.format(local, 'T')}"
    )
    return format_html('<time datetime="{}">{}</time>', moment.isoformat(), text)


def format_duration(ms: int | None) -> str:
    """Render milliseconds as a short human duration: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


class StatsView(View):
    """Render the stats table for users who may view tasks."""

    model_admin = None

    def get(self, request):
        model_admin = self.model_admin
        if not model_admin.has_view_permission(request):
            raise PermissionDenied
        opts = model_admin.model._meta
        link = model_admin.changelist_url
        queues = queue_stats(model_admin.using)
        rows = [
            {
                "queue": q.queue,
                "queue_url": link(queue=q.queue),
                "cells": [
                    (q.counts[status], link(queue=q.queue, status__exact=status))
                    for status in STATUSES
                ],
                "total": q.total,
                "oldest_due": (
                    None if q.oldest_due_age_ms is None else format_duration(q.oldest_due_age_ms)
                ),
                "finished": [q.finished_last_hour[status] for status in TERMINAL_STATUSES],
                "finished_total": q.finished_total,
            }
            for q in queues
        ]
        context = {
            **model_admin.admin_site.each_context(request),
            "title": _("Task queue stats"),
            "opts": opts,
            "statuses": STATUSES,
            "terminal_statuses": TERMINAL_STATUSES,
            "rows": rows,
            "totals": [sum(q.counts[status] for q in queues) for status in STATUSES],
            "total": sum(q.total for q in queues),
            "finished_totals": [
                sum(q.finished_last_hour[status] for q in queues) for status in TERMINAL_STATUSES
            ],
            "finished_total": sum(q.finished_total for q in queues),
            "changelist_url": link(),
            "media": model_admin.media,
        }
        request.current_app = model_admin.admin_site.name
        return TemplateResponse(
            request, f"admin/{opts.app_label}/{opts.model_name}/stats.html", context
        )
