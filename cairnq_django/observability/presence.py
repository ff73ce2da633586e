"""A worker recording itself in the workers table while it runs.

The worker's claim loop drives it (tick() on every turn of the loop, stop()
at shutdown), on the loop's own database session: it inserts the row at
start, refreshes `last_seen_ms` and the task counts about every interval, and
deletes the row when the worker stops cleanly. A thread of its own would hold
a third session per worker (or reconnect, two transactions, every refresh),
which is what limits how many workers fit in max_connections. Each refresh
is one transaction and comes up to INTERVAL_JITTER early or late, so a fleet
started together does not write together. In the same transaction, off the
claim path, it looks for due tasks whose name no live worker handles
(unhandled.py) and warns about each such name, at most once per
WARN_UNHANDLED_EVERY_S. A worker that dies without stopping leaves its row behind, which
readers then show as gone (see models/workers.py's GONE_AFTER_INTERVALS); any live worker
deletes rows that have been gone for longer than FORGET_AFTER_MS.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from django.db import connections, transaction

from ..models import WorkerRecord
from ..models.workers import GONE_AFTER_INTERVALS
from ..pooling import release
from ..tables import known_missing_tables
from .overview import database_now_ms
from .unhandled import describe, registered_names, unhandled_names

logger = logging.getLogger("cairnq_django.worker")

# How long a gone worker's row stays visible before a live worker deletes it.
FORGET_AFTER_MS = 3_600_000
# A floor under CAIRNQ['WORKER_REPORT_INTERVAL'], so 0 cannot spin the thread.
MIN_INTERVAL_MS = 100
# Each refresh comes up to this fraction of the interval early or late.
INTERVAL_JITTER = 0.2
# How often one name nothing handles is warned about again while it stays so.
WARN_UNHANDLED_EVERY_S = 600.0


def package_version() -> str:
    try:
        return metadata.version("cairnq-django")
    except metadata.PackageNotFoundError:
        return "unknown"


class Presence:
    """Keep one worker's row in the workers table fresh, driven by the worker's loop."""

    def __init__(
        self,
        *,
        worker: Any,
        interval_ms: int,
        running: Callable[[], int],
        report: Callable[..., None],
    ) -> None:
        self.worker = worker
        self.using = worker.using
        self.interval_ms = max(MIN_INTERVAL_MS, int(interval_ms or 0))
        self.running = running
        self.report = report
        self._failing = False
        self._check_failing = False
        # (queue, name) -> when it was last warned about (time.monotonic()).
        self._warned: dict[tuple[str, str], float] = {}
        # When (time.monotonic()) the next refresh is due, for the loop to wake
        # for it; 0: at the first tick.
        self.due_at = 0.0

    def tick(self) -> None:
        """Refresh the row if it is due (call often, from the thread that owns the session)."""
        now = time.monotonic()
        if now < self.due_at:
            return
        # Jittered, so workers started together do not refresh together.
        spread = self.interval_ms * INTERVAL_JITTER
        wait_ms = max(MIN_INTERVAL_MS, self.interval_ms + random.uniform(-spread, spread))  # noqa: S311 - jitter
        self.due_at = now + wait_ms / 1000
        self._safely(self.refresh)
        release(self.using)  # a pooled connection is not kept between refreshes

    def stop(self) -> None:
        """Delete the row (a clean stop)."""
        self._safely(self.remove)

    def refresh(self) -> None:
        """record() and the unhandled-name check, as one transaction."""
        with transaction.atomic(using=self.using):
            self.record()
            self._check_unhandled()

    def _check_unhandled(self) -> None:
        try:
            # A savepoint: a failed check keeps the refresh, and costs no
            # transaction of its own (the idle cost per worker stays one).
            with transaction.atomic(using=self.using):
                self.warn_unhandled()
        except Exception as exc:
            if not self._check_failing:  # once per outage, as _safely does
                self._check_failing = True
                self._report(exc)
        else:
            self._check_failing = False

    def record(self) -> None:
        """Insert or refresh this worker's row, and forget long-gone workers."""
        rows = WorkerRecord.objects.using(self.using)
        now = database_now_ms(self.using)
        running = self.running()
        fields = {"tasks_running": running, "tasks_done": max(0, self.worker.tasks_started - running)}
        if not rows.filter(pk=self.worker.worker_id).update(last_seen_ms=now, **fields):
            rows.create(
                id=self.worker.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=list(self.worker.queues),
                names=sorted(self.worker.handlers),
                concurrency=self.worker.concurrency,
                version=package_version(),
                started_at_ms=now,
                last_seen_ms=now,
                interval_ms=self.interval_ms,
                **fields,
            )
        rows.gone(now - FORGET_AFTER_MS).delete()
        if self._failing:
            logger.info("The worker is recorded in the workers table again.")
            self._failing = False

    def warn_unhandled(self) -> None:
        """Warn once per WARN_UNHANDLED_EVERY_S about each name due here that nothing handles."""
        now = database_now_ms(self.using)
        registered = registered_names(WorkerRecord.objects.using(self.using).live(now))
        found = unhandled_names(
            self.using, list(self.worker.queues), now_ms=now, registered=registered,
            # As long as a stopped worker counts as live: until then its
            # names may still be claimed.
            min_wait_ms=GONE_AFTER_INTERVALS * self.interval_ms,
        )
        clock = time.monotonic()
        for item in found:
            key = (item.queue, item.name)
            last = self._warned.get(key)
            if last is not None and clock - last < WARN_UNHANDLED_EVERY_S:
                continue
            self._warned[key] = clock
            logger.warning(
                "%s", describe(item, handled_here=registered.get(item.queue, ()))
            )

    def remove(self) -> None:
        WorkerRecord.objects.using(self.using).filter(pk=self.worker.worker_id).delete()

    def _safely(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            connections[self.using].close()
            # Once per outage: a missing table (migrate not run) would
            # otherwise report every interval.
            if not self._failing:
                self._failing = True
                self._report(exc)

    def _report(self, exc: Exception) -> None:
        if known_missing_tables(self.using):
            return  # the claim loop stops the worker for it, in one line
        self.report(exc, phase="presence")
