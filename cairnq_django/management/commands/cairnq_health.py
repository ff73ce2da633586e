"""manage.py cairnq_health: exit non-zero, with one line per reason, when the queue is stuck.

Exit 0: healthy. Exit 1: a queue has due tasks and no live worker serves it,
or its oldest due task has waited longer than --max-age, or it has due tasks
under a name no live worker handles (or the tables are missing, or the queue
cannot be read). Exit 2: the queue's database is unreachable. For container probes
and cron alerts.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from cairnq_django.conf import cairnq_settings
from cairnq_django.management import add_database_argument
from cairnq_django.observability.health import check
from cairnq_django.retention import cli_duration

DEFAULT_MAX_AGE_MS = 300_000


class Command(BaseCommand):
    help = (
        "Check the task queue: exit 1 when a queue has due tasks and no live worker "
        "serves it, its oldest due task waited longer than --max-age, due tasks have a "
        "name no live worker handles, or the CairnQ tables are missing; 2 when the "
        "database is unreachable, 0 otherwise; each problem is printed on one line."
    )
    requires_system_checks: list[str] = []
    requires_migrations_checks = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-age", type=cli_duration, default=DEFAULT_MAX_AGE_MS, metavar="DURATION",
            help="How long the oldest due task may wait before the queue counts as stuck "
            "(milliseconds, or 30s, 5m, 1h). Default: 5m.",
        )
        parser.add_argument(
            "--queue", "-q", action="append", dest="queues", metavar="QUEUE",
            help="Check only this queue; repeat for several. Default: every queue.",
        )
        add_database_argument(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        health = check(
            options["database"] or cairnq_settings.DATABASE,
            max_age_ms=options["max_age"], queues=options["queues"],
        )
        if health.ok:
            if options["verbosity"] >= 1:
                self.stdout.write("OK")
            return
        for problem in health.problems:
            self.stderr.write(problem)
        self.stdout.flush()
        self.stderr.flush()
        sys.exit(health.code)
