"""manage.py cairnq_queue: pause, resume and list queues for the whole fleet."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.utils import Error as DatabaseError

from ...conf import cairnq_settings
from ...errors import TablesMissing
from ...flow.pausing import pause_queue, queue_states, resume_queue
from ...records import STATUSES
from ...store import get_store
from ...tables import known_missing_tables
from ...validators import cli_database

ACTIONS = ("list", "pause", "resume")
BY = "manage.py cairnq_queue"


def queue_rows(using: str) -> list[dict[str, Any]]:
    """Every queue with tasks or a state row: counts by status, paused, when and by whom."""
    counts = get_store(using).stats()
    states = queue_states(using=using)
    rows = []
    for queue in sorted(set(counts) | set(states)):
        state = states.get(queue)
        rows.append({
            "queue": queue,
            **counts.get(queue, dict.fromkeys(STATUSES, 0)),
            "paused": bool(state and state.paused),
            "changed_at_ms": state.changed_at_ms if state else None,
            "changed_by": state.changed_by if state else None,
        })
    return rows


class Command(BaseCommand):
    help = (
        "Pause or resume a queue for every Django worker of the fleet, or list the queues "
        "with their queued and running counts and whether each is paused. A paused queue "
        "still accepts enqueues and lets running tasks finish; no worker claims from it "
        "until it is resumed. Workers of other CairnQ SDKs do not honour a pause."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", nargs="?", default="list", choices=ACTIONS,
            help="list (default): each queue, its counts and paused state; "
            "pause QUEUE: stop claims from it (returns once no claim can still take one); "
            "resume QUEUE: claims start again and idle workers are woken.",
        )
        parser.add_argument("queue", nargs="?", help="The queue, for pause and resume.")
        parser.add_argument("--json", action="store_true", help="With list: print JSON.")
        parser.add_argument(
            "--database", metavar="ALIAS", type=cli_database,
            help="Database alias holding the CairnQ tables. Default: CAIRNQ['DATABASE'].",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or cairnq_settings.DATABASE
        action, queue = options["action"], options["queue"]
        if action == "list" and queue is not None:
            raise CommandError("list takes no queue name.")
        if action != "list" and queue is None:
            raise CommandError(f"{action} needs the name of a queue.")
        if action != "list" and options["json"]:
            raise CommandError("--json goes with list only.")
        missing = known_missing_tables(using)
        if missing:
            raise CommandError(str(TablesMissing(using, missing)))
        try:
            if action == "list":
                self._list(using, options["json"])
            elif action == "pause":
                changed = pause_queue(queue, using=using, by=BY)
                self.stdout.write(
                    f"Paused {queue!r}: no worker claims from it until it is resumed."
                    if changed else f"{queue!r} was already paused."
                )
            else:
                changed = resume_queue(queue, using=using, by=BY)
                self.stdout.write(
                    f"Resumed {queue!r}." if changed else f"{queue!r} was not paused."
                )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CommandError(f"The queue on database {using!r} failed: {text}") from exc

    def _list(self, using: str, as_json: bool) -> None:
        rows = queue_rows(using)
        if as_json:
            self.stdout.write(json.dumps({"queues": rows}, indent=2))
            return
        if not rows:
            self.stdout.write("No queues: no tasks, and none paused.")
            return
        table = [["QUEUE", "QUEUED", "RUNNING", "STATE"]] + [
            [row["queue"], str(row["queued"]), str(row["running"]),
             f"paused by {row['changed_by'] or '?'}" if row["paused"] else "active"]
            for row in rows
        ]
        widths = [max(len(r[i]) for r in table) for i in range(4)]
        for r in table:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
