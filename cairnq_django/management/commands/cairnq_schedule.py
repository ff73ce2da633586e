"""manage.py cairnq_schedule: list schedules and their next occurrences, run, pause, resume."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...conf import cairnq_settings
from ...schedules import state
from ...schedules.config import ScheduleConfigError
from ...schedules.overview import find_schedule, schedule_views
from ...validators import cli_integer
from .. import add_database_argument

ACTIONS = ("list", "run", "pause", "resume")

# --next lists occurrences computed in this process; more than this is a typo.
MAX_NEXT = 1000


class Command(BaseCommand):
    help = (
        "List the schedules of settings.CAIRNQ['SCHEDULE'] with their last run and next "
        "occurrences (the default), or run one now, or pause or resume one. Workers enqueue "
        "the occurrences themselves; this command is not needed for schedules to run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "action", nargs="?", default="list", choices=ACTIONS,
            help="list (default); run NAME: enqueue its task now, outside its timetable; "
            "pause NAME / resume NAME (a resumed schedule carries on from now).",
        )
        parser.add_argument("name", nargs="?", help="The schedule, for run, pause and resume.")
        parser.add_argument(
            "--next", type=cli_integer(maximum=MAX_NEXT), default=1, metavar="N", dest="count",
            help="With list: show the next N occurrences of each schedule (default 1).",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        using = options["database"] or cairnq_settings.DATABASE
        action, name = options["action"], options["name"]
        try:
            if action == "list":
                if name:
                    raise CommandError("list takes no schedule name.")
                return self._list(using, options["count"])
            if not name:
                raise CommandError(f"{action} needs the name of a schedule.")
            schedule = find_schedule(name)
        except (LookupError, ScheduleConfigError) as exc:
            raise CommandError(str(exc)) from None
        if action == "run":
            task = state.run_now(using, schedule)
            self.stdout.write(f"Enqueued {schedule.task} {task.id} for schedule {name!r}.")
        elif action == "pause":
            changed = state.set_paused(using, name, True)
            self.stdout.write(f"Paused {name!r}." if changed else f"{name!r} was already paused.")
        else:
            changed = state.set_paused(using, name, False)
            self.stdout.write(
                f"Resumed {name!r}; it carries on from now." if changed
                else f"{name!r} was not paused."
            )

    def _list(self, using: str, count: int) -> None:
        views = schedule_views(using, count=count)
        if not views:
            self.stdout.write("No schedules: settings.CAIRNQ['SCHEDULE'] is empty.")
            return
        for view in views:
            self.stdout.write(self.style.MIGRATE_HEADING(view.name))
            schedule = view.schedule
            if schedule is None:
                self.stdout.write("  not in settings.CAIRNQ['SCHEDULE'] any more: stopped")
            else:
                self.stdout.write(f"  task      {schedule.task} on queue "
                    f"{schedule.queue or 'its handler declares (else default)'!r}")
                when = schedule.expression
                if schedule.cron is not None:
                    when += f": {schedule.describe()}"
                self.stdout.write(f"  when      {when}")
                self.stdout.write(f"  missed    {schedule.missed}")
            if view.paused:
                self.stdout.write("  state     paused")
            row = view.state
            if row is None or row.last_task_id is None:
                self.stdout.write("  last run  never")
            else:
                status = view.last_task.status if view.last_task else "purged"
                self.stdout.write(
                    f"  last run  {view.local(row.last_enqueued_at_ms):%Y-%m-%d %H:%M:%S %Z} "
                    f"{row.last_task_id} ({status})"
                )
            for index, ms in enumerate(view.next_ms):
                label = "next" if index == 0 else ""
                self.stdout.write(f"  {label:<9} {view.local(ms):%Y-%m-%d %H:%M:%S %Z}")
