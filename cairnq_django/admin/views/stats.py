"""The admin's queue stats page: is work flowing?

The counts come from store.admin_reads.queue_stats, which the overview shares.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _

from ...humanize import human_duration
from ...records import STATUSES, TERMINAL_STATUSES
from ...store.admin_reads import QueueStats, queue_stats
from ..guarded import TaskAdminBase


def queue_row(model_admin: TaskAdminBase, q: QueueStats) -> dict[str, Any]:
    """A queue's linked counts per status and oldest due wait, as stats and the dashboard show them."""
    link = model_admin.changelist_url
    return {
        "queue": q.queue,
        "url": link(queue=q.queue),
        "cells": [(q.counts[s], link(queue=q.queue, status__exact=s)) for s in STATUSES],
        "oldest_due": None if q.oldest_due_age_ms is None else human_duration(q.oldest_due_age_ms),
    }


def stats_view(model_admin: TaskAdminBase, request: HttpRequest) -> TemplateResponse:
    """Render the stats table for users who may view tasks."""
    model_admin.require_view_permission(request)
    opts = model_admin.opts
    link = model_admin.changelist_url
    queues = queue_stats(model_admin.using)
    rows = [
        {
            **queue_row(model_admin, q),
            "total": q.total,
            "finished": [q.finished_last_hour[status] for status in TERMINAL_STATUSES],
            "finished_total": q.finished_total,
        }
        for q in queues
    ]
    context = {
        "title": _("Task queue stats"),
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
    }
    return model_admin.render_page(
        request, f"admin/{opts.app_label}/{opts.model_name}/stats.html", context
    )
