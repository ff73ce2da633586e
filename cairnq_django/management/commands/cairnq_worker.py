"""manage.py cairnq_worker: run the registered task handlers (and, with --sweep, retention)."""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ...conf import cairnq_settings
from ...errors import ProtocolVersionMismatch, TablesMissing
from ...observability import DEFAULT_METRICS_ADDR
from ...validators import cli_integer
from ...worker import Worker, WorkerOptions
from .. import add_database_argument
from ..worker_checks import run_worker_checks

if TYPE_CHECKING:
    from ...retention import RetentionSweeper


# Errors that end the worker: the database is not one it can serve until
# someone acts (runs migrate, upgrades a package); retrying would only repeat them.
_CANNOT_RUN_HERE = (TablesMissing, ProtocolVersionMismatch)


class Command(BaseCommand):
    # handle() runs them in two parts (worker_checks.py), as runserver runs its own.
    requires_system_checks: list[str] = []
    help = (
        "Run the CairnQ task handlers registered with @cairnq_django.task (in each "
        "installed app's tasks.py) until SIGTERM/SIGINT. The first signal stops claiming "
        "and lets running handlers finish for up to --shutdown-timeout; a second one exits "
        "at once. Defaults come from settings.CAIRNQ."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        s = cairnq_settings
        parser.add_argument(
            "--queue", "-q", action="append", dest="queues", metavar="QUEUE",
            help="Claim tasks from this queue; repeat for several. Default: "
            "CAIRNQ['QUEUES'] plus any queue a handler declares "
            f"(currently {', '.join(s.QUEUES) if not isinstance(s.QUEUES, str) else s.QUEUES}).",
        )
        parser.add_argument(
            "--names", metavar="NAME[,NAME...]",
            help="Only run these registered task names (comma-separated). Default: every "
            "registered handler. Tasks with other names are left for other workers.",
        )
        parser.add_argument(
            "--concurrency", "-c", type=cli_integer(),
            help="Handler calls running at once (sync handlers on threads, async ones on an "
            "event loop; a batch is one call). Default: CAIRNQ['CONCURRENCY'] "
            f"({s.CONCURRENCY}).",
        )
        parser.add_argument(
            "--lease", type=cli_integer(), metavar="MS",
            help="Lease per claimed task in milliseconds; renewed every lease/3 while the "
            "handler runs. A worker that dies loses its tasks to another worker after this "
            f"long. Default: CAIRNQ['LEASE'] ({s.LEASE}).",
        )
        parser.add_argument(
            "--poll", type=cli_integer(), metavar="MS",
            help="Idle sleep between polls in milliseconds (cut short by a notification "
            f"where the database supports it). Default: CAIRNQ['POLL_INTERVAL'] "
            f"({s.POLL_INTERVAL}).",
        )
        parser.add_argument(
            "--max-run", type=cli_integer(0), metavar="MS",
            help="Wall-clock ceiling per attempt in milliseconds; a handler still running "
            "then is abandoned and its task fails retryably as 'handler_timeout'. 0 "
            f"disables it. Default: CAIRNQ['MAX_RUN'] ({s.MAX_RUN}).",
        )
        parser.add_argument(
            "--shutdown-timeout", type=cli_integer(0), metavar="MS",
            help="On SIGTERM/SIGINT, how long to let running handlers finish before their "
            "tasks are requeued for another worker. Default: CAIRNQ['SHUTDOWN_TIMEOUT'] "
            f"({s.SHUTDOWN_TIMEOUT}).",
        )
        parser.add_argument(
            "--burst", action="store_true",
            help="Drain what is claimable now, wait for it to finish, then exit 0 "
            "(for tests, cron and CI). Tasks scheduled for later are left queued.",
        )
        add_database_argument(parser)
        parser.add_argument(
            "--sweep", action="store_true",
            help="Also run the retention sweeper (CAIRNQ['RETENTION']) in this process.",
        )
        parser.add_argument(
            "--no-scheduler", action="store_false", dest="scheduler",
            help="Do not enqueue the periodic tasks of CAIRNQ['SCHEDULE'] from this worker "
            "(other workers still do; each occurrence is enqueued once whichever runs it).",
        )
        parser.add_argument(
            "--metrics-port", type=cli_integer(0), metavar="PORT",
            help="Serve this worker's Prometheus counters and histograms on "
            "http://ADDR:PORT/metrics (needs prometheus_client; 0 picks a free port, "
            "logged at start). Give each worker on a host its own port. The server has no "
            "authentication and answers on every path, showing task and queue names, "
            "counters and process memory; keep it on a private network.",
        )
        parser.add_argument(
            # The loopback by default: the server has no authentication, so
            # reaching it from elsewhere is a choice made by --metrics-addr.
            "--metrics-addr", default=DEFAULT_METRICS_ADDR, metavar="ADDR",
            help="Address the --metrics-port server listens on. Default: "
            f"{DEFAULT_METRICS_ADDR} (this host only); 0.0.0.0 or :: for every interface, "
            "so that Prometheus on another host can scrape it (behind a firewall: there is "
            "no authentication).",
        )
        parser.add_argument(
            "--reload", action=argparse.BooleanOptionalAction, default=None,
            help="Restart the worker when the project's code changes (Django's autoreloader, "
            "as runserver uses it), stopping it gracefully first. For development. "
            "Default: on when DEBUG is true, except with --burst. Signal the PID the "
            "command started as: it passes SIGTERM and SIGINT on to the worker.",
        )
        parser.add_argument(
            "--noreload", action="store_false", dest="reload",
            help="Same as --no-reload (runserver's spelling).",
        )
        parser.add_argument(
            "--skip-checks", action="store_true",
            help="Skip system checks (for deployments that run `manage.py check` before).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        checked = not options["skip_checks"]
        if checked:
            run_worker_checks(self, after_first_poll=False)
        self._configure_logging(options["verbosity"])
        reload = options["reload"]
        if reload and options["burst"]:
            raise CommandError("--reload and --burst cannot be combined.")
        if reload is None:
            reload = settings.DEBUG and not options["burst"]
        if reload:
            from ...reloading import run_with_reloader

            # For development, where start-up time matters less than seeing
            # every issue before the first task runs: all of them now.
            if checked:
                run_worker_checks(self, after_first_poll=True)
            # The supervisor builds nothing; each child process builds its own worker.
            run_with_reloader(lambda: self._build_worker(options), fatal=_CANNOT_RUN_HERE)
            return
        worker = self._build_worker(options)
        worker.install_signal_handlers()
        try:
            worker.run(
                after_first_poll=(lambda: run_worker_checks(self, after_first_poll=True))
                if checked else None
            )
        except _CANNOT_RUN_HERE as exc:
            # One line, not a traceback: it says what to do.
            raise CommandError(str(exc)) from exc

    def _build_worker(self, options: dict[str, Any]) -> Worker:
        """The worker the options describe, beside a sweeper with --sweep; metrics if asked."""
        names = None
        if options["names"]:
            names = [n.strip() for n in options["names"].split(",") if n.strip()]
        try:
            worker = (WorkerBesideSweeper if options["sweep"] else Worker)(
                WorkerOptions.from_settings(
                    queues=options["queues"],
                    names=names,
                    concurrency=options["concurrency"],
                    lease_ms=options["lease"],
                    poll_ms=options["poll"],
                    max_run_ms=options["max_run"],  # 0 turns a configured MAX_RUN off
                    shutdown_timeout_ms=options["shutdown_timeout"],
                    burst=options["burst"],
                    using=options["database"],
                    scheduler=options["scheduler"],
                )
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if options["metrics_port"] is not None:
            try:
                from ...observability.metrics import serve_worker_metrics
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from exc
            serve_worker_metrics(options["metrics_port"], options["metrics_addr"])
        return worker

    def _configure_logging(self, verbosity: int) -> None:
        """Show the start/end lines unless LOGGING already decides, or -v asks otherwise."""
        logger = logging.getLogger("cairnq_django.worker")
        if verbosity >= 2:
            logger.setLevel(logging.DEBUG if verbosity >= 3 else logging.INFO)
        elif verbosity == 0:
            logger.setLevel(logging.WARNING)
        if verbosity >= 1 and not logger.hasHandlers():
            stream = logging.StreamHandler()
            stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(stream)
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.INFO)
        if verbosity >= 2 and logger.hasHandlers():
            # A configured handler may filter INFO itself; -v 2 means "show me".
            for handler in _handlers_of(logger):
                if handler.level > logger.level:
                    handler.setLevel(logger.level)


def _handlers_of(logger: logging.Logger) -> list[logging.Handler]:
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        current = current.parent if current.propagate else None
    return found


class WorkerBesideSweeper(Worker):
    """A worker with the retention sweeper (CAIRNQ['RETENTION']) on a thread beside it.

    It runs, stops and takes signals as the worker does (the reloader drives it
    the same way); the sweeper starts with run() and stops when the worker has.
    """

    sweeper: RetentionSweeper | None = None

    def run(self, *, after_first_poll: Callable[[], None] | None = None) -> None:
        from ...tables import check_tables

        check_tables(self.using)  # before the sweeper, which would report it too
        self._start_sweeper()
        try:
            super().run(after_first_poll=after_first_poll)
        finally:
            self._stop_sweeper()

    def _start_sweeper(self) -> None:
        from ...retention import RetentionSweeper

        try:
            self.sweeper = RetentionSweeper.from_settings(self.using)
        except Exception as exc:
            self.report(exc, phase="sweep")
            return
        sweeper = self.sweeper

        def sweep() -> None:
            try:
                sweeper.run()
            except Exception as exc:
                self.report(exc, phase="sweep")
            finally:
                connections.close_all()

        threading.Thread(target=sweep, name="cairnq-sweeper", daemon=True).start()

    def _stop_sweeper(self) -> None:
        if self.sweeper is None:
            return
        try:
            self.sweeper.stop(timeout=5)
        except Exception as exc:
            self.report(exc, phase="sweep")
