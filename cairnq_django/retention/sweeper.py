"""The sweeper: apply retention rules in bounded batches, once or on an interval.

Each rule is one `purge()` filter of the store, deleted SWEEP_BATCH_SIZE rows at
a time with a SWEEP_PAUSE between statements, so other writers get in between.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from ..conf import cairnq_settings
from ..pooling import release
from ..store import get_store
from ..validators import check_integer
from ..workflows.control import release_finished_steps
from .config import SETTING, parse_retention
from .rules import RetentionRule, RuleResult

# The package's name, which the docs tell deployments to watch.
logger = logging.getLogger("cairnq_django.retention")


class RetentionSweeper:
    """Purge finished tasks by retention rules, in bounded batches, once or on an interval.

    Thread-safe to stop: `run()` usually lives in its own thread (the worker's
    --sweep) or the main thread (cairnq_sweep --loop), and `stop()` is called
    from elsewhere (or from a signal handler, with timeout=0). A stopped
    sweeper stays stopped; build a new one to sweep again.
    """

    def __init__(
        self,
        *,
        using: str | None = None,
        rules: Any = None,
        batch_size: int | None = None,
        pause_ms: int | None = None,
        interval_ms: int | None = None,
        dry_run: bool = False,
        on_batch: Callable[[RetentionRule, int], None] | None = None,
        on_sweep: Callable[[list[RuleResult]], None] | None = None,
    ) -> None:
        self.using = using or cairnq_settings.DATABASE
        if rules is None:
            try:
                self.rules = parse_retention(cairnq_settings.raw("RETENTION"))
            except ValueError as exc:
                raise ImproperlyConfigured(str(exc)) from None
        else:
            self.rules = parse_retention(rules, label="rules")
        self.batch_size = check_integer(
            "batch_size", cairnq_settings.SWEEP_BATCH_SIZE if batch_size is None else batch_size
        )
        self.pause_ms = check_integer(
            "pause_ms", cairnq_settings.SWEEP_PAUSE if pause_ms is None else pause_ms, minimum=0
        )
        self.interval_ms = check_integer(
            "interval_ms", cairnq_settings.SWEEP_INTERVAL if interval_ms is None else interval_ms
        )
        self.dry_run = dry_run
        self.on_batch = on_batch
        self.on_sweep = on_sweep
        self._stopping = threading.Event()
        # Set while no sweep or run loop is in progress; stop() waits on it.
        self._idle = threading.Event()
        self._idle.set()
        self._active = 0
        self._active_lock = threading.Lock()

    @classmethod
    def from_settings(cls, using: str | None = None, **overrides: Any) -> RetentionSweeper:
        """Build a sweeper from settings.CAIRNQ (RETENTION and the SWEEP_* knobs)."""
        return cls(using=using, **overrides)

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    # ---------------------------------------------------------- bookkeeping
    def _enter(self) -> None:
        with self._active_lock:
            self._active += 1
            self._idle.clear()

    def _leave(self) -> None:
        with self._active_lock:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    # -------------------------------------------------------------- sweeping
    def sweep_once(self) -> list[RuleResult]:
        """Apply every rule until nothing it matches is left (or stop() is called)."""
        self._enter()
        try:
            # The workflows' backstop, before any purge: steps whose task another SDK's worker ended.
            settled = 0 if self.dry_run else release_finished_steps(using=self.using)
            if settled:
                logger.info("Released the children of %d workflow steps that ended outside a worker's "
                            "settle.", settled)
            return [self._sweep_rule(rule) for rule in self.rules]
        finally:
            self._leave()

    def _sweep_rule(self, rule: RetentionRule) -> RuleResult:
        if self.dry_run:
            # The purge's own filters, counted instead of deleted.
            count = 0 if self.stopped else get_store(self.using).count_purgeable(**rule.purge_filters())
            return RuleResult(rule=rule, deleted=count, batches=0, dry_run=True,
                              complete=not self.stopped)
        deleted = batches = 0
        while not self.stopped:
            ids = get_store(self.using).purge(**rule.purge_filters(), limit=self.batch_size)
            if ids:
                deleted += len(ids)
                batches += 1
                if self.on_batch is not None:
                    self.on_batch(rule, deleted)
            if len(ids) < self.batch_size:
                return RuleResult(rule=rule, deleted=deleted, batches=batches)
            # The pause is the point of batching: other writers take the
            # write lock (SQLite) or the I/O (Postgres) between statements.
            if self.pause_ms:
                release(self.using)
                self._stopping.wait(self.pause_ms / 1000)
        return RuleResult(rule=rule, deleted=deleted, batches=batches, complete=False)

    def run(self) -> None:
        """Sweep now and then every interval_ms until stop() is called."""
        if not self.rules:
            logger.warning(
                "Retention is off (%s is None); the sweeper has nothing to do.", SETTING
            )
            return
        self._enter()
        try:
            while not self.stopped:
                try:
                    results = self.sweep_once()
                except Exception as exc:  # a busy or lost database must not end retention
                    self._report(exc)
                    connections[self.using].close_if_unusable_or_obsolete()
                else:
                    self._log(results)
                    if self.on_sweep is not None:
                        self.on_sweep(results)
                release(self.using)  # a pooled connection is not held across the interval
                self._stopping.wait(self.interval_ms / 1000)
        finally:
            # run() usually owns its thread; give its connection back.
            connections[self.using].close()
            self._leave()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop sweeping; wait up to `timeout` s for the batch in flight. True once idle."""
        self._stopping.set()
        return self._idle.wait(timeout)

    # ------------------------------------------------------------- reporting
    def _log(self, results: Iterable[RuleResult]) -> None:
        for result in results:
            if result.deleted:
                logger.info(
                    "Retention %s %d %s in %d %s.",
                    "would delete" if result.dry_run else "deleted",
                    result.deleted, result.description, result.batches,
                    "batch" if result.batches == 1 else "batches",
                )

    def _report(self, exc: Exception) -> None:
        logger.exception(
            "Retention sweep on database %r failed; retrying next interval.", self.using
        )
        hook_path = cairnq_settings.ON_ERROR
        if not hook_path:
            return
        try:
            import_string(hook_path)(exc, {"phase": "sweep", "database": self.using})
        except Exception:  # a reporting hook must never end the sweep loop
            logger.exception("settings.CAIRNQ['ON_ERROR'] raised while reporting a sweep error.")
