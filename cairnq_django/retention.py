"""Retention: delete finished tasks on a schedule, in short bounded batches.

Nothing else removes rows, and payloads carry real data, so a deployment
without retention leaks disk. settings.CAIRNQ["RETENTION"] says what may go:

    None                                          # never sweep (the default)
    timedelta(days=7)                             # every finished task after 7 days
    {"succeeded": timedelta(hours=1),             # per status; a status left out
     "failed": timedelta(days=30)}                # is never swept
    [{"queue": "rpc", "older_than": 300_000},     # rules filtering by queue,
     {"status": "failed", "name": "emails.send",  # status and/or name
      "older_than": timedelta(days=90)}]

Numbers are milliseconds. Each rule is one `Store.purge` filter, swept in
batches of SWEEP_BATCH_SIZE rows with a SWEEP_PAUSE between statements, so a
large backlog drains as a series of short writes that producers and workers
slip in between (on SQLite each statement holds the single write lock).
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from .conf import cairnq_settings, to_ms
from .records import STATUSES, TERMINAL_STATUSES
from .store import Store, get_store

logger = logging.getLogger("cairnq_django.retention")

SETTING = "settings.CAIRNQ['RETENTION']"
RULE_KEYS = ("queue", "status", "name", "older_than")

_FORMS_HINT = (
    "Use None to turn retention off, one cutoff for every finished status "
    "(timedelta(days=7) or a number of milliseconds), a {status: cutoff} dict such as "
    "{'succeeded': timedelta(hours=1), 'failed': timedelta(days=30)}, or a list of rule "
    "dicts such as [{'queue': 'emails', 'status': 'succeeded', 'older_than': timedelta(hours=1)}]."
)
_CUTOFF_HINT = (
    "Write a cutoff of zero or more as a timedelta, e.g. timedelta(days=7), or as a "
    "number of milliseconds, e.g. 604800000."
)
_STATUS_HINT = (
    "Use one of 'succeeded', 'failed' or 'canceled'; queued and running tasks are never swept."
)
_RULE_HINT = (
    "A rule is a dict with a required 'older_than' (timedelta or milliseconds) and optional "
    "'queue', 'status' and 'name', e.g. {'queue': 'emails', 'status': 'succeeded', "
    "'older_than': timedelta(hours=1)}."
)


# ------------------------------------------------------------------ durations
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> int:
    """Return milliseconds for '1500', '30s', '30m', '2h', '7d', '1w' or '1h30m'."""
    value = str(text).strip().lower().replace(" ", "")
    if value.isdigit():
        return int(value)
    pos, total = 0, 0.0
    for match in _PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS_MS[match.group(2)]
        pos = match.end()
    if not value or pos != len(value):
        raise ValueError(
            f"{text!r} is not a duration; write a number of milliseconds or a number with "
            "a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d."
        )
    return int(total)


def format_duration(ms: int) -> str:
    """Return a short human form of a duration in milliseconds, e.g. '1d12h'."""
    if ms == 0:
        return "0s"
    parts = []
    rest = ms
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNITS_MS[unit]
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts)


# ---------------------------------------------------------------- rules
@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionRule:
    """Finished tasks matching the filters may be deleted older_than_ms after completion."""

    older_than_ms: int
    queue: str | None = None
    status: str | None = None  # None means every finished status
    name: str | None = None

    def describe(self) -> str:
        """Say in words what this rule deletes."""
        what = f"{self.status} tasks" if self.status else "finished tasks"
        if self.queue is not None:
            what += f" in queue {self.queue!r}"
        if self.name is not None:
            what += f" named {self.name!r}"
        return f"{what} older than {format_duration(self.older_than_ms)}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True, slots=True, kw_only=True)
class RuleResult:
    """What one sweep did for one rule (or, in a dry run, would do)."""

    rule: RetentionRule
    deleted: int  # in a dry run: how many rows match now
    batches: int  # purge statements that deleted rows (0 in a dry run)
    dry_run: bool = False
    complete: bool = True  # False when stop() cut the sweep short

    @property
    def description(self) -> str:
        return self.rule.describe()


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cutoff_errors(value: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif _is_number(value):
        ms = value
    elif isinstance(value, str):
        return [
            (
                f"{where} is the string {value!r}; a cutoff must be a timedelta or a number "
                "of milliseconds.",
                _CUTOFF_HINT + " Strings like '7d' are accepted only by the cairnq_sweep command.",
            )
        ]
    else:
        return [
            (
                f"{where} must be a timedelta or a number of milliseconds, not "
                f"{type(value).__name__} {value!r}.",
                _CUTOFF_HINT,
            )
        ]
    if not math.isfinite(ms):
        return [(f"{where} is {value!r}, which is not a finite duration.", _CUTOFF_HINT)]
    if ms < 0:
        message = f"{where} is negative ({value!r}); a cutoff cannot be in the future."
        return [(message, _CUTOFF_HINT)]
    return []


def _status_errors(status: Any, subject: str) -> list[tuple[str, str]]:
    if status in TERMINAL_STATUSES:
        return []
    if status in STATUSES:
        problem = "which is not a finished status"
    else:
        problem = "which is not a task status"
    return [(f"{subject} {status!r}, {problem}.", _STATUS_HINT)]


def _text_errors(value: Any, where: str, field: str) -> list[tuple[str, str]]:
    if value is None or (isinstance(value, str) and value):
        return []
    return [
        (
            f"{where}[{field!r}] must be a non-empty string, not {value!r}.",
            f"Give the {field} to match as a string, or leave '{field}' out to match "
            f"every {field}.",
        )
    ]


def _rule_errors(rule: Any, where: str) -> list[tuple[str, str]]:
    if isinstance(rule, RetentionRule):
        rule = {
            "queue": rule.queue, "status": rule.status, "name": rule.name,
            "older_than": rule.older_than_ms,
        }
    if not isinstance(rule, Mapping):
        return [(f"{where} must be a dict, not {type(rule).__name__} {rule!r}.", _RULE_HINT)]
    errors = []
    for key in sorted(set(rule) - set(RULE_KEYS), key=str):
        errors.append((f"{where} has an unknown key {key!r}.", _RULE_HINT))
    if "older_than" not in rule:
        errors.append((f"{where} has no 'older_than'.", _RULE_HINT))
    else:
        errors += _cutoff_errors(rule["older_than"], f"{where}['older_than']")
    if rule.get("status") is not None:
        errors += _status_errors(rule["status"], f"{where}['status'] is")
    errors += _text_errors(rule.get("queue"), where, "queue")
    errors += _text_errors(rule.get("name"), where, "name")
    return errors


def retention_config_errors(value: Any, *, label: str = SETTING) -> list[tuple[str, str]]:
    """Return (message, hint) pairs for every problem in a retention configuration."""
    if value is None:
        return []
    if isinstance(value, (timedelta, str)) or _is_number(value):
        return _cutoff_errors(value, label)
    if isinstance(value, Mapping):
        if not value:
            return [
                (
                    f"{label} is an empty dict, which sweeps nothing.",
                    "Name at least one status, e.g. {'succeeded': timedelta(days=7)}, or set "
                    "RETENTION to None to turn retention off.",
                )
            ]
        if any(key in RULE_KEYS for key in value):
            return [
                (
                    f"{label} is a single rule dict; rules go in a list.",
                    "Wrap the rule in a list: [{'queue': ..., 'older_than': ...}], or map "
                    "statuses to cutoffs: {'succeeded': timedelta(hours=1)}.",
                )
            ]
        errors = []
        for status, cutoff in value.items():
            errors += _status_errors(status, f"{label} has a key")
            errors += _cutoff_errors(cutoff, f"{label}[{status!r}]")
        return errors
    if isinstance(value, (list, tuple)):
        if not value:
            return [
                (
                    f"{label} is an empty list, which sweeps nothing.",
                    "Give at least one rule, e.g. [{'status': 'succeeded', 'older_than': "
                    "timedelta(days=7)}], or set RETENTION to None to turn retention off.",
                )
            ]
        errors = []
        for i, rule in enumerate(value):
            errors += _rule_errors(rule, f"{label}[{i}]")
        return errors
    return [
        (
            f"{label} must be None, a cutoff, a dict or a list, not {type(value).__name__}.",
            _FORMS_HINT,
        )
    ]


def parse_retention(value: Any, *, label: str = SETTING) -> list[RetentionRule]:
    """Return the rules a retention configuration describes (none when it is None)."""
    errors = retention_config_errors(value, label=label)
    if errors:
        raise ValueError(" ".join(f"{message} {hint}" for message, hint in errors))
    if value is None:
        return []
    if isinstance(value, timedelta) or _is_number(value):
        return [RetentionRule(older_than_ms=to_ms(value))]
    if isinstance(value, Mapping):
        return [RetentionRule(older_than_ms=to_ms(v), status=s) for s, v in value.items()]
    rules = []
    for rule in value:
        if isinstance(rule, RetentionRule):
            rules.append(rule)
        else:
            rules.append(
                RetentionRule(
                    older_than_ms=to_ms(rule["older_than"]),
                    queue=rule.get("queue"),
                    status=rule.get("status"),
                    name=rule.get("name"),
                )
            )
    return rules


# ---------------------------------------------------------------- sweeper
def _count_purgeable(store: Store, rule: RetentionRule) -> int:
    """Count what `store.purge` would delete for a rule: the same QuerySet, read only."""
    return store.count_purgeable(
        older_than_ms=rule.older_than_ms, queue=rule.queue, status=rule.status, name=rule.name
    )


def _positive_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


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
        self.batch_size = _positive_int(
            "batch_size", cairnq_settings.SWEEP_BATCH_SIZE if batch_size is None else batch_size, 1
        )
        self.pause_ms = _positive_int(
            "pause_ms", cairnq_settings.SWEEP_PAUSE if pause_ms is None else pause_ms, 0
        )
        self.interval_ms = _positive_int(
            "interval_ms",
            cairnq_settings.SWEEP_INTERVAL if interval_ms is None else interval_ms,
            1,
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
    def store(self) -> Store:
        return get_store(self.using)

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
            return [self._sweep_rule(rule) for rule in self.rules]
        finally:
            self._leave()

    def _sweep_rule(self, rule: RetentionRule) -> RuleResult:
        if self.dry_run:
            count = 0 if self.stopped else _count_purgeable(self.store, rule)
            return RuleResult(rule=rule, deleted=count, batches=0, dry_run=True,
                              complete=not self.stopped)
        deleted = batches = 0
        while not self.stopped:
            ids = self.store.purge(
                older_than_ms=rule.older_than_ms,
                queue=rule.queue,
                status=rule.status,
                name=rule.name,
                limit=self.batch_size,
            )
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
                    "Retention %s %d %s in %d batch(es).",
                    "would delete" if result.dry_run else "deleted",
                    result.deleted, result.description, result.batches,
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


def rules_for_overrides(
    rules: Sequence[RetentionRule],
    *,
    older_than_ms: int | None = None,
    statuses: Sequence[str] = (),
    queues: Sequence[str] = (),
    names: Sequence[str] = (),
) -> list[RetentionRule]:
    """Return one-off rules: a new cutoff for the given filters, or `rules` narrowed to them.

    With older_than_ms, every combination of the filters becomes a rule with
    that cutoff. Without it, each configured rule is intersected with each
    combination, so a narrowed sweep never deletes more than the settings allow.
    """
    combos = [
        (s, q, n)
        for s in (list(statuses) or [None])
        for q in (list(queues) or [None])
        for n in (list(names) or [None])
    ]
    if older_than_ms is not None:
        return [
            RetentionRule(older_than_ms=older_than_ms, status=s, queue=q, name=n)
            for s, q, n in combos
        ]
    narrowed: list[RetentionRule] = []
    for rule in rules:
        for s, q, n in combos:
            merged = {}
            for field, want in (("status", s), ("queue", q), ("name", n)):
                have = getattr(rule, field)
                if want is not None and have is not None and want != have:
                    break
                merged[field] = have if have is not None else want
            else:
                candidate = RetentionRule(older_than_ms=rule.older_than_ms, **merged)
                if candidate not in narrowed:
                    narrowed.append(candidate)
    return narrowed
