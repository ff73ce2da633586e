"""The Scheduler: a thread in every worker that enqueues each due occurrence once.

There is no leader. Each worker's scheduler reads the state rows, sleeps until
the earliest occurrence is due, and then tries to advance that schedule's
cursor by compare-and-set in the transaction that enqueues the task (see
state.py); whichever worker commits first enqueues it, the others find the
cursor moved and write nothing. A worker killed mid-transaction leaves nothing
behind, and the next scheduler to look does the work.

The idle cost is one read of the state table per wake-up: at the earliest
next occurrence, and at least every MAX_SLEEP_MS to notice pauses, resumes and
other workers' progress. Nothing is queried per schedule per second.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from contextlib import nullcontext, suppress
from datetime import UTC, datetime
from typing import Any

from django.db import connections

from ..conf import cairnq_settings
from ..pooling import release
from ..records import TaskRecord
from ..store import get_store
from . import state
from .config import Plan, Schedule, configured_schedules

# A child of the worker's logger: the scheduler runs inside the worker, and
# `cairnq_worker -v 2` shows its lines with the worker's own.
logger = logging.getLogger("cairnq_django.worker.scheduler")

# The longest the scheduler sleeps without re-reading the state table; each
# such re-read comes at a random point of its last MAX_SLEEP_JITTER, so the
# schedulers of a fleet started together do not read together. Occurrences
# themselves are never moved.
MAX_SLEEP_MS = 30_000
MAX_SLEEP_JITTER = 0.5
# Wake a little after an occurrence, never before it (clocks are read in ms).
_WAKE_MARGIN_MS = 5
# Backoff after the scheduler's database work fails.
_RETRY_FIRST_MS = 250
_RETRY_MAX_MS = 5_000


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


class Scheduler:
    """Enqueue the occurrences of `schedules` as they fall due, until stopped."""

    def __init__(
        self,
        *,
        using: str | None = None,
        schedules: list[Schedule] | None = None,
        write_gate: Any = None,
        report: Callable[..., None] | None = None,
    ) -> None:
        self.using = using or cairnq_settings.DATABASE
        self.schedules = configured_schedules() if schedules is None else list(schedules)
        # The worker's SQLite write gate, so the scheduler takes its turn at the
        # write lock with the claim loop and the settler instead of sleeping in
        # SQLite's busy handler.
        self._write_gate = write_gate if write_gate is not None else nullcontext()
        self._report = report
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.enqueued = 0

    # ------------------------------------------------------------ control
    def start(self) -> None:
        """Run in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="cairnq-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5) -> None:
        self._stopping.set()
        if self._thread is not None and timeout:
            self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    # ------------------------------------------------------------ running
    def _run(self) -> None:
        try:
            self.run()
        finally:
            connections.close_all()

    def run(self) -> None:
        """Tick until stop(): enqueue what is due, then sleep until the next occurrence."""
        if not self.schedules:
            return
        logger.info(
            "Scheduler starting on database %r with %d %s: %s.",
            self.using, len(self.schedules),
            "schedule" if len(self.schedules) == 1 else "schedules",
            ", ".join(s.name for s in self.schedules),
        )
        retry_ms = _RETRY_FIRST_MS
        while not self._stopping.is_set():
            try:
                sleep_ms = self.tick()
            except Exception as exc:
                self._error(exc)
                with suppress(Exception):
                    connections[self.using].close()
                sleep_ms, retry_ms = retry_ms, min(_RETRY_MAX_MS, retry_ms * 2)
            else:
                retry_ms = _RETRY_FIRST_MS
            release(self.using)  # a pooled connection is not held across the sleep
            self._stopping.wait(sleep_ms / 1000)

    def tick(self) -> int:
        """Enqueue every due occurrence once; return how long to sleep, in ms."""
        now = get_store(self.using).clock_ms()
        names = [s.name for s in self.schedules]
        states = state.read_states(self.using, names)
        if len(states) < len(names):
            with self._write_gate:
                states = state.ensure_states(self.using, names, now)
        wake = now + round(MAX_SLEEP_MS * random.uniform(1 - MAX_SLEEP_JITTER, 1))  # noqa: S311 - jitter
        for schedule in self.schedules:
            if self._stopping.is_set():
                break
            row = states[schedule.name]
            if row.paused:
                continue
            plan = schedule.plan(row.cursor_ms, now)
            if plan.run or plan.advance_to != row.cursor_ms:
                self._carry_out(schedule, row.cursor_ms, plan)
            if plan.next_ms is not None:
                wake = min(wake, plan.next_ms)
        return max(0, wake - get_store(self.using).clock_ms()) + _WAKE_MARGIN_MS

    def _carry_out(self, schedule: Schedule, cursor: int, plan: Plan) -> None:
        if plan.missed:
            logger.warning(
                "Schedule %r missed occurrences before %s (no scheduler was running); "
                "policy %r: %s.",
                schedule.name, _iso(plan.advance_to), schedule.missed,
                "running one now" if plan.run else "skipping them",
            )
        for index, occurrence in enumerate(plan.run):
            last = index == len(plan.run) - 1
            with self._write_gate:
                fired = state.advance(
                    self.using, schedule, expected_cursor_ms=cursor, occurrence_ms=occurrence,
                    new_cursor_ms=plan.advance_to if last else occurrence,
                )
            if not isinstance(fired, TaskRecord):
                return  # None: another scheduler got there first (or it was paused)
            self.enqueued += 1
            logger.info(
                "Schedule %r: enqueued %s %s for %s.",
                schedule.name, schedule.task, fired.id, _iso(occurrence),
            )
            cursor = plan.advance_to if last else occurrence
        if not plan.run:
            with self._write_gate:
                state.advance(
                    self.using, schedule, expected_cursor_ms=cursor, occurrence_ms=None,
                    new_cursor_ms=plan.advance_to,
                )

    def _error(self, exc: BaseException) -> None:
        if self._report is not None:
            self._report(exc, phase="schedule")
        else:
            logger.error("The scheduler recovered from an error: %s", exc, exc_info=exc)
