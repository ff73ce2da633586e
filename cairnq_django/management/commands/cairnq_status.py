"""manage.py cairnq_status: the workers and the queue × status table, in the terminal."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.utils import Error as DatabaseError

from cairnq_django.conf import cairnq_settings
from cairnq_django.errors import CairnQError, TablesMissing
from cairnq_django.humanize import first_line, progress_percent, text_table, valid_progress
from cairnq_django.humanize import human_duration as format_duration
from cairnq_django.management import add_database_argument
from cairnq_django.observability.flow import limits_table, usage_row
from cairnq_django.observability.overview import Overview, overview
from cairnq_django.observability.presence import package_version
from cairnq_django.records import STATUSES
from cairnq_django.tables import known_missing_tables


def as_text(view: Overview) -> str:
    lines = []
    live = sum(w.live for w in view.workers)
    lines.append(f"Workers: {live} live, {len(view.workers) - live} gone")
    if view.workers:
        rows = []
        for w in view.workers:
            r = w.record
            rows.append([
                r.id, r.host, str(r.pid), ",".join(r.queues), str(r.concurrency),
                str(len(w.running)), str(r.tasks_done),
                f"{format_duration(w.seen_ago_ms)} ago", "live" if w.live else "gone",
            ])
        header = ["ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "RUNNING", "DONE",
                  "LAST SEEN", "STATE"]
        lines.extend(text_table(header, rows))
        for w in view.workers:
            for task in w.running:
                percent = progress_percent(task.progress)
                progress = (
                    "" if task.progress is None
                    else " (invalid progress)" if percent is None else f" {percent}%"
                )
                lines.append(f"  {w.record.id} runs {task.name} {task.id}{progress}")
    lines.append("")
    lines.append(f"Queues: {len(view.queues)}")
    if view.queues:
        rows = [
            [q.queue, *(str(q.counts[s]) for s in STATUSES),
             "-" if q.oldest_due_age_ms is None else format_duration(q.oldest_due_age_ms),
             "paused" if q.queue in view.paused else "active"]
            for q in view.queues
        ]
        lines.extend(
            text_table(["QUEUE", *(s.upper() for s in STATUSES), "OLDEST DUE", "STATE"], rows)
        )
    if view.paused:
        lines.append(f"Paused queues (no Django worker claims from them): {', '.join(view.paused)}")
    if view.limits:
        lines.append("")
        lines.append(f"Flow limits: {len(view.limits)}")
        lines.extend(limits_table(view.limits, view.busiest_keys))
    if view.limits_error:
        lines.append(f"CAIRNQ['LIMITS'] is invalid, so no limit is shown: {view.limits_error}")
    if any(view.workflows.values()):
        lines.append("")
        lines.append("Workflows: " + ", ".join(f"{n} {state}" for state, n in view.workflows.items()))
    return "\n".join(lines)


def as_json(view: Overview) -> str:
    return json.dumps({
        "now_ms": view.now_ms,
        "workers": [
            {
                "id": w.record.id, "host": w.record.host, "pid": w.record.pid,
                "queues": w.record.queues, "names": w.record.names,
                "concurrency": w.record.concurrency, "version": w.record.version,
                "started_at_ms": w.record.started_at_ms,
                "last_seen_ms": w.record.last_seen_ms, "live": w.live,
                "tasks_done": w.record.tasks_done,
                "running": [
                    {"id": t.id, "name": t.name, "queue": t.queue,
                     # NaN or Infinity from a foreign writer would not be JSON.
                     "progress": valid_progress(t.progress)}
                    for t in w.running
                ],
            }
            for w in view.workers
        ],
        "queues": {
            q.queue: {**q.counts, "oldest_due_age_ms": q.oldest_due_age_ms}
            for q in view.queues
        },
        "paused_queues": view.paused,
        "limits": [usage_row(usage, view.busiest_keys) for usage in view.limits],
        "limits_error": view.limits_error,
        "workflows": view.workflows,
    }, indent=2)


class Command(BaseCommand):
    help = (
        "Print the CairnQ workers (live and gone), the queue × status table, and each flow "
        "limit in force with its use (running, starts in the window, tasks it holds back)."
    )
    requires_system_checks: list[str] = []

    def get_version(self) -> str:
        """What --version prints: this package's version (Django's command default prints Django's)."""
        return f"cairnq-django {package_version()}"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of tables.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"] or cairnq_settings.DATABASE
        missing = known_missing_tables(alias)
        if missing:
            raise CommandError(str(TablesMissing(alias, missing)))
        try:
            view = overview(alias)
        except (DatabaseError, CairnQError) as exc:
            raise CommandError(
                f"Reading the queue on database {alias!r} failed (has `migrate` run?): "
                f"{first_line(exc)}"
            ) from exc
        self.stdout.write(as_json(view) if options["json"] else as_text(view))
