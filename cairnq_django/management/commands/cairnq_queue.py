"""manage.py cairnq_queue: pause, resume and list queues, and set, clear and list flow limits.

Every action is a thin call into cairnq_django.flow (pausing.py, limits.py),
the same functions the admin's buttons call, so the command, the admin and
the Python API cannot disagree on what a pause or a limit means.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    DjangoHelpFormatter,
)
from django.db.utils import Error as DatabaseError

from ...conf import cairnq_settings
from ...errors import TablesMissing
from ...flow.limits import clear_limit, effective_limits, limit_usage, runtime_limits, set_limit
from ...flow.pausing import pause_queue, queue_states, resume_queue
from ...humanize import first_line, text_table
from ...observability.flow import (
    SCOPE_LABELS,
    busiest_keys,
    limit_rows,
    limit_text,
    limits_table,
)
from ...records import STATUSES
from ...retention.durations import cli_duration
from ...store import get_store
from ...tables import check_tables
from ...validators import INT32_MAX, cli_integer
from .. import add_database_argument

QUEUE_ACTIONS = ("list", "pause", "resume")
LIMIT_ACTIONS = ("limits", "limit", "unlimit")
ACTIONS = (*QUEUE_ACTIONS, *LIMIT_ACTIONS)
BY = "manage.py cairnq_queue"
# The options naming what a limit applies to, and the scope each stands for.
SCOPE_OPTIONS = {"limit_queue": "queue", "limit_name": "name", "limit_key_prefix": "key_prefix"}


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


def _per(text: str) -> int:
    """--per: a duration of at least 1 ms (argparse names the option in the error)."""
    ms = cli_duration(text)
    if ms < 1:
        raise argparse.ArgumentTypeError(f"a rate's period must be at least 1 ms, got {text!r}")
    return ms


_per.__name__ = "duration"


class _HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Django's option order, with the description's lines and examples kept as written."""


class Command(BaseCommand):
    help = """\
Pause or resume a queue for every Django worker of the fleet, and set, clear
and list the fleet-wide flow limits, without restarting any worker.

  list (default)    each queue, its queued and running counts, paused or not
  pause QUEUE       stop claims from it; returns once no claim can still take
                    one. Enqueues are still accepted, running tasks finish.
  resume QUEUE      claims start again, and idle workers are woken
  limits            each limit in force, where it comes from (settings or
                    runtime), and its use now: running, starts in the window,
                    due tasks it holds back
  limit SCOPE LIMIT set a runtime limit; workers apply it within about a
                    second. It replaces a CAIRNQ['LIMITS'] entry on the same
                    queue, name or prefix until it is cleared.
  limit SCOPE --lift
                    no limit on it at all, lifting the CAIRNQ['LIMITS'] entry
  unlimit SCOPE     clear the runtime limit (or lift); the CAIRNQ['LIMITS']
                    entry on it, if any, applies again

SCOPE is --queue QUEUE, --name TASK_NAME or --key-prefix PREFIX; LIMIT is
--concurrency N (at most N running at once), --rate N [--per DURATION] (at
most N starts in any window of DURATION, default 1s), or both.

Workers of other CairnQ SDKs honour neither pauses nor limits.

examples:
  manage.py cairnq_queue pause emails
  manage.py cairnq_queue limit --name reports.generate --concurrency 3
  manage.py cairnq_queue limit --key-prefix account: --concurrency 1
  manage.py cairnq_queue limit --queue partner --rate 20 --per 1s
  manage.py cairnq_queue unlimit --name reports.generate
  manage.py cairnq_queue limits --json
"""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        return super().create_parser(
            prog_name, subcommand, formatter_class=_HelpFormatter, **kwargs
        )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", nargs="?", default="list", choices=ACTIONS,
            help="What to do (see above). Default: list.",
        )
        parser.add_argument("queue", nargs="?", help="The queue, for pause and resume.")
        scope = parser.add_argument_group(
            "limit and unlimit: what the limit applies to (exactly one)"
        ).add_mutually_exclusive_group()
        scope.add_argument(
            "--queue", dest="limit_queue", metavar="QUEUE",
            help="Every task of this queue, whatever its name.",
        )
        scope.add_argument(
            "--name", dest="limit_name", metavar="TASK_NAME", help="Every task of this name.",
        )
        scope.add_argument(
            "--key-prefix", dest="limit_key_prefix", metavar="PREFIX",
            help="Each concurrency key starting with PREFIX, apart (enqueue(..., "
            "concurrency_key='account:42') with --key-prefix account: and --concurrency 1 "
            "runs one task per account at a time).",
        )
        values = parser.add_argument_group("limit: the limit (--concurrency, --rate or both)")
        values.add_argument(
            "--concurrency", type=cli_integer(1, maximum=INT32_MAX), metavar="N",
            help="At most N running at once across the fleet.",
        )
        values.add_argument(
            "--rate", type=cli_integer(1, maximum=INT32_MAX), metavar="N",
            help="At most N starts per period (a sliding window) across the fleet.",
        )
        values.add_argument(
            "--lift", action="store_true",
            help="Instead of a limit: no limit on it at all, lifting the CAIRNQ['LIMITS'] entry "
            "on the same queue, name or prefix until unlimit.",
        )
        values.add_argument(
            "--per", type=_per, metavar="DURATION",
            help="The rate's period: milliseconds or a number with a unit (500ms, 1s, 1m, 1h). "
            "Default: 1s.",
        )
        parser.add_argument("--json", action="store_true", help="With list or limits: print JSON.")
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or cairnq_settings.DATABASE
        action, queue = options["action"], options["queue"]
        self._check_combination(action, queue, options)
        try:
            check_tables(using)
            if action == "list":
                self._list(using, options["json"])
            elif action == "pause":
                changed = pause_queue(queue, using=using, by=BY)
                self.stdout.write(
                    f"Paused {queue!r}: no worker claims from it until it is resumed."
                    if changed else f"{queue!r} was already paused."
                )
            elif action == "resume":
                changed = resume_queue(queue, using=using, by=BY)
                self.stdout.write(
                    f"Resumed {queue!r}." if changed else f"{queue!r} was not paused."
                )
            elif action == "limits":
                self._limits(using, options["json"])
            else:
                self._limit(action, using, options)
        except (ValueError, TablesMissing) as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"The queue on database {using!r} failed: {first_line(exc)}") from exc

    def _check_combination(self, action: str, queue: str | None, options: dict[str, Any]) -> None:
        """Refuse, in one line, options that do not go with the action."""
        scoped = [option for option in SCOPE_OPTIONS if options[option] is not None]
        values = [o for o in ("concurrency", "rate", "per") if options[o] is not None]
        if options["lift"]:
            values.append("lift")
        if action in ("list", "limits") and queue is not None:
            raise CommandError(f"{action} takes no queue name.")
        if action in ("pause", "resume") and queue is None:
            raise CommandError(f"{action} needs the name of a queue.")
        if action in ("limit", "unlimit") and queue is not None:
            raise CommandError(
                f"{action} takes the queue as --queue {queue}, or a --name or --key-prefix."
            )
        if action not in ("list", "limits") and options["json"]:
            raise CommandError("--json goes with list and limits only.")
        if action in ("limit", "unlimit") and not scoped:
            raise CommandError(f"{action} needs one of --queue, --name or --key-prefix.")
        if action not in ("limit", "unlimit") and scoped:
            raise CommandError(
                f"--{scoped[0].removeprefix('limit_').replace('_', '-')} goes with limit and "
                "unlimit only."
            )
        if action != "limit" and values:
            raise CommandError(f"--{values[0]} goes with limit only.")
        if action == "limit" and options["lift"] and values != ["lift"]:
            raise CommandError("--lift goes alone: it sets no limit at all.")
        if action == "limit" and not values:
            raise CommandError("limit needs --concurrency, --rate or both (or --lift).")
        if options["per"] is not None and options["rate"] is None:
            raise CommandError("--per is the period of a --rate; give the rate too.")

    def _limit(self, action: str, using: str, options: dict[str, Any]) -> None:
        option = next(o for o in SCOPE_OPTIONS if options[o] is not None)
        scope, value = SCOPE_OPTIONS[option], options[option]
        if action == "limit":
            limit = set_limit(
                scope, value, concurrency=options["concurrency"], rate=options["rate"],
                per=options["per"], using=using, by=BY,
            )
            self.stdout.write(
                f"Lifted every limit on {_what(scope)} {value!r} until unlimit."
                if limit.is_lifted else f"Limited {_what(scope)} {value!r} to {limit_text(limit)}."
            )
            self.stdout.write("Workers apply it within about a second.")
            return
        if clear_limit(scope, value, using=using, by=BY):
            self.stdout.write(f"Cleared the runtime limit on {_what(scope)} {value!r}.")
        else:
            self.stdout.write(f"There was no runtime limit on {_what(scope)} {value!r}.")
        still = next(
            (limit for limit in effective_limits(using) if (limit.scope, limit.value) == (scope, value)),
            None,
        )
        if still is not None:
            self.stdout.write(f"CAIRNQ['LIMITS'] still limits it: {limit_text(still)}.")

    def _limits(self, using: str, as_json: bool) -> None:
        # Lifted ones are in force as "no limit", so limit_usage leaves them out: say them apart.
        lifted = [limit for limit in runtime_limits(using) if limit.is_lifted]
        if as_json:
            self.stdout.write(json.dumps({
                "limits": limit_rows(using),
                "lifted": [{"scope": limit.scope, "value": limit.value} for limit in lifted],
            }, indent=2))
            return
        usages = limit_usage(using=using)
        if not usages and not lifted:
            self.stdout.write("No flow limits: none in CAIRNQ['LIMITS'], none set at run time.")
            return
        if usages:
            for line in limits_table(usages, busiest_keys(using, usages)):
                self.stdout.write(line)
        for limit in lifted:
            self.stdout.write(
                f"No limit on {_what(limit.scope)} {limit.value!r}: lifted at run time (unlimit "
                "restores CAIRNQ['LIMITS'])."
            )

    def _list(self, using: str, as_json: bool) -> None:
        rows = queue_rows(using)
        if as_json:
            self.stdout.write(json.dumps({"queues": rows}, indent=2))
            return
        if not rows:
            self.stdout.write("No queues: no tasks, and none paused.")
            return
        for line in text_table(["QUEUE", "QUEUED", "RUNNING", "STATE"], [
            [row["queue"], str(row["queued"]), str(row["running"]),
             f"paused by {row['changed_by'] or '?'}" if row["paused"] else "active"]
            for row in rows
        ]):
            self.stdout.write(line)


def _what(scope: str) -> str:
    return SCOPE_LABELS[scope]
