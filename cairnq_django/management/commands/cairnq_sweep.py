"""Delete finished tasks by the retention settings, once or on an interval."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from cairnq_django.conf import cairnq_settings
from cairnq_django.management import add_database_argument
from cairnq_django.records import TERMINAL_STATUSES
from cairnq_django.retention import (
    SETTING,
    RetentionRule,
    RetentionSweeper,
    RuleResult,
    cli_duration,
    format_compact_duration,
    parse_retention,
    rules_for_overrides,
)
from cairnq_django.validators import cli_integer


class Progress:
    """Report a drain of more than one batch on stderr, at most every `every_s` seconds.

    On a terminal the line is rewritten in place; otherwise (--progress into a
    file or pipe) each report is its own line.
    """

    def __init__(self, stream: OutputWrapper, *, interactive: bool, every_s: float = 0.5) -> None:
        self.stream = stream
        self.interactive = interactive
        self.every_s = every_s
        self.batch_size = 0
        self._last = 0.0
        self._dirty = False

    def __call__(self, rule: RetentionRule, deleted: int) -> None:
        now = time.monotonic()
        if deleted <= self.batch_size or now - self._last < self.every_s:
            return
        self._last = now
        line = f"{rule.describe()}: {deleted:,} deleted so far"
        if self.interactive:
            self._write(f"\r\x1b[K{line}")
            self._dirty = True
        else:
            self._write(line + "\n")

    def clear(self) -> None:
        if self._dirty:
            self._write("\r\x1b[K")
            self._dirty = False

    def _write(self, text: str) -> None:
        # Plain text: the command's stderr wrapper would colour it as an error.
        self.stream.write(text, style_func=str, ending="")
        self.stream.flush()


@contextmanager
def stop_on_signals(sweeper: RetentionSweeper) -> Iterator[None]:
    """Turn the first SIGINT/SIGTERM into sweeper.stop(); a second one exits at once."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only flag the stop: the sweep runs on this very thread, so waiting
        # for it inside the handler would wait forever.
        for sig in previous:
            signal.signal(sig, signal.SIG_DFL)
        sweeper.stop(timeout=0)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Command(BaseCommand):
    help = (
        "Delete finished CairnQ tasks by settings.CAIRNQ['RETENTION'] in short batches. "
        "Sweeps once unless --loop is given. --older-than replaces the settings for a one-off "
        "sweep; --status/--queue/--name narrow it, or the settings' rules."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop", action="store_true",
            help="Sweep every SWEEP_INTERVAL until SIGTERM or SIGINT.",
        )
        parser.add_argument(
            "--dry-run", action="store_true",
            help="Count what would be deleted; delete nothing.",
        )
        parser.add_argument(
            "--older-than", metavar="AGE", type=cli_duration,
            help="One-off cutoff instead of the settings: milliseconds or e.g. 30m, 2h, 7d.",
        )
        parser.add_argument(
            "--status", action="append", default=[], choices=TERMINAL_STATUSES,
            help="Only this finished status (repeatable).",
        )
        parser.add_argument(
            "--queue", action="append", default=[], help="Only this queue (repeatable)."
        )
        parser.add_argument(
            "--name", action="append", default=[], help="Only this task name (repeatable)."
        )
        add_database_argument(parser)
        parser.add_argument(
            "--batch-size", metavar="N", type=cli_integer(),
            help="Rows per delete statement (default: settings.CAIRNQ['SWEEP_BATCH_SIZE']).",
        )
        parser.add_argument(
            "--progress", action="store_true",
            help="Show progress on stderr even when it is not a terminal.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity: int = options["verbosity"]  # _report() is quieter below 2
        using = options["database"] or cairnq_settings.DATABASE
        rules = self._rules(options)
        progress = None
        if options["progress"] or self.stderr.isatty():
            progress = Progress(self.stderr, interactive=self.stderr.isatty())
        try:
            sweeper = RetentionSweeper(
                using=using,
                rules=rules,
                batch_size=options["batch_size"],
                dry_run=options["dry_run"],
                on_batch=progress,
                on_sweep=lambda results: self._report(results, progress, quiet_if_empty=True),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if progress is not None:
            progress.batch_size = sweeper.batch_size
        with stop_on_signals(sweeper):
            if options["loop"]:
                self.stdout.write(
                    f"Sweeping database {using!r} every "
                    f"{format_compact_duration(sweeper.interval_ms)} until SIGTERM or SIGINT."
                )
                self.stdout.flush()
                sweeper.run()
                self.stdout.write("Stopped.")
            else:
                self._report(sweeper.sweep_once(), progress, quiet_if_empty=False)

    def _rules(self, options: dict[str, Any]) -> list[RetentionRule]:
        older_than_ms = options["older_than"]
        configured = []
        if older_than_ms is None:
            try:
                configured = parse_retention(cairnq_settings.raw("RETENTION"))
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            if not configured:
                raise CommandError(
                    f"Retention is off ({SETTING} is None). Configure it, or pass "
                    "--older-than (e.g. --older-than 7d) for a one-off sweep."
                )
        rules = rules_for_overrides(
            configured,
            older_than_ms=older_than_ms,
            statuses=options["status"],
            queues=options["queue"],
            names=options["name"],
        )
        if not rules:
            raise CommandError(
                f"No rule in {SETTING} covers the given --status/--queue/--name; nothing to "
                "sweep. Pass --older-than to sweep them anyway."
            )
        return rules

    def _report(
        self, results: list[RuleResult], progress: Progress | None, *, quiet_if_empty: bool
    ) -> None:
        if progress is not None:
            progress.clear()
        verb = "Would delete" if any(r.dry_run for r in results) else "Deleted"
        total = 0
        for result in results:
            total += result.deleted
            if quiet_if_empty and not result.deleted and self.verbosity < 2:
                continue
            notes = []
            if not result.dry_run:
                notes.append(f"{result.batches} batch{'es' if result.batches != 1 else ''}")
            if not result.complete:
                notes.append("stopped early")
            line = f"{verb} {result.deleted:,} {result.description}"
            self.stdout.write(line + (f" ({', '.join(notes)})." if notes else "."))
        if len(results) > 1 and (total or not quiet_if_empty or self.verbosity >= 2):
            self.stdout.write(f"{verb} {total:,} {'task' if total == 1 else 'tasks'} in all.")
        self.stdout.flush()
