"""The task page's attempt timeline (store/attempts.py): one table row per attempt, escaped throughout."""

from __future__ import annotations

import json

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from ..humanize import human_duration
from ..models import Task, TaskAttempt
from ..store.attempts import Attempt, attempts_of
from .display import error_block, format_time

# A task snoozed thousands of times would make a page no one reads; the
# first ones in attempt order are shown, and the page says so.
MAX_ROWS = 200

# Outcome -> the status badge colour it borrows.
_BADGE = {
    "running": "running", "succeeded": "succeeded", "retried": "queued", "snoozed": "queued",
    "failed": "failed", "lost": "failed", "canceled": "canceled", "unrecorded": "canceled",
}


def timeline_html(using: str, task: Task, raw_error: object) -> SafeString | str:
    """The attempts of `task` as a table, oldest first; "-" before its first attempt.

    `raw_error` is the task's error column as the page reads it (RawText): the
    model's own `error` is deferred, and decoding a peer's malformed value
    there would fail the page.
    """
    rows = list(
        TaskAttempt.objects.using(using).filter(task_id=task.pk).order_by("attempt", "id")[
            : MAX_ROWS + 1
        ]
    )
    cut = len(rows) > MAX_ROWS
    attempts = attempts_of(_TaskRow(task), rows[:MAX_ROWS])
    if not attempts:
        return "-"
    body = format_html_join("", "{}", ((_row(attempt, raw_error),) for attempt in attempts))
    note = format_html(
        '<p class="help">{}</p>', _("Only the first %(count)d recorded attempts are shown.")
        % {"count": MAX_ROWS},
    ) if cut else ""
    return format_html(
        '<table class="cq-attempts"><thead><tr><th>{}</th><th>{}</th><th>{}</th><th>{}</th>'
        "<th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>{}",
        _("attempt"), _("outcome"), _("worker"), _("started"), _("ended"), _("took"), _("error"),
        body, note,
    )


class _TaskRow:
    """The task columns attempts_of() reads, without the deferred error."""

    def __init__(self, task: Task) -> None:
        self.status = task.status
        self.attempt = task.attempt
        self.worker_id = task.worker_id
        self.completed_at_ms = task.completed_at_ms
        self.error = None  # shown from the raw column instead (_row)


def _row(attempt: Attempt, raw_error: object) -> SafeString:
    took = "-"
    if attempt.started_at_ms is not None and attempt.ended_at_ms is not None:
        took = human_duration(max(0, attempt.ended_at_ms - attempt.started_at_ms))
    if not attempt.recorded and attempt.outcome in ("failed", "canceled"):
        # The task row's own ending (a peer settled it): its error is the row's.
        error = "-" if raw_error is None else error_block(raw_error)
    else:
        error = "-" if attempt.error is None else error_block(json.dumps(attempt.error))
    return format_html(
        '<tr class="cq-attempt-{}"><td>{}</td><td><span class="cq-status cq-status-{}">{}</span></td>'
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        attempt.outcome, attempt.attempt, _BADGE.get(attempt.outcome, "canceled"), attempt.outcome,
        attempt.worker_id or "-", format_time(attempt.started_at_ms),
        format_time(attempt.ended_at_ms), took, error,
    )
