"""The one place settings.CAIRNQ is read, with its defaults.

Values are read on every access (not cached) so `override_settings` in tests
and per-deployment settings modules behave as Django users expect. Durations
accept a `timedelta` or a number of milliseconds.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings

from .records import DEFAULT_LEASE_MS, DEFAULT_QUEUE

DEFAULTS: dict[str, Any] = {
    # Alias of the database holding the CairnQ tables.
    "DATABASE": "default",
    # Per-queue backpressure: None (off), an int for every queue, or {queue: int}.
    "MAX_QUEUE_DEPTH": None,
    # How long enqueue waits for headroom before raising QueueFull.
    "MAX_QUEUE_WAIT": 5_000,
    # Defer enqueue until the caller's transaction on the *default* alias
    # commits; for a queue that lives in a separate database.
    "ENQUEUE_ON_COMMIT": False,
    # wait()/call() polling: first interval, growth factor, ceiling.
    "WAIT_POLL_INITIAL": 100,
    "WAIT_POLL_MAX": 500,
    # Wake sleeping workers and wait() early (Postgres LISTEN, SQLite
    # data_version). Behind a transaction-mode pooler, set LISTEN_DATABASE.
    "WAKEUPS": True,
    # PostgreSQL: where the wakeup's LISTEN connection goes. None: the queue's
    # alias; another DATABASES alias; or a libpq connection string whose
    # parameters replace the alias's (e.g. "host=db.internal port=5432"), to
    # reach PostgreSQL directly past PgBouncer in transaction mode.
    "LISTEN_DATABASE": None,
    # PostgreSQL: how many idle workers with the same queues and handlers
    # LISTEN for new tasks; the others stand by until a seat frees
    # (wakeup/seats.py). None: every worker listens.
    "LISTENERS": 2,
    # Worker defaults (each has a command-line flag).
    "QUEUES": [DEFAULT_QUEUE],
    "CONCURRENCY": 8,
    "LEASE": DEFAULT_LEASE_MS,
    "POLL_INTERVAL": 1_000,
    "MAX_RUN": None,
    "SHUTDOWN_TIMEOUT": 30_000,
    # How long a worker thread keeps its database connection between tasks when
    # the alias's CONN_MAX_AGE is 0 (Django's default, tuned for requests):
    # reconnecting per task costs more than most tasks. None keeps CONN_MAX_AGE.
    "WORKER_CONN_MAX_AGE": 300_000,
    # PostgreSQL: libpq parameters (keepalives, tcp_user_timeout, connect_timeout)
    # the worker's, the listener's and wait()'s connections get, under the
    # alias's own OPTIONS (connection_options.py). A dict replaces single
    # defaults (None drops one); False turns them off.
    "CONNECTION_OPTIONS": None,
    # PostgreSQL: statement_timeout for the worker's claims, renewals and
    # completions, so a statement stuck on a lock or a dead path ends well
    # before its lease does. None: a third of the lease; 0: none.
    "WORKER_STATEMENT_TIMEOUT": None,
    "RETRY_BACKOFF_BASE": 1_000,
    "RETRY_BACKOFF_CAP": 30_000,
    # Dotted path to a callable(exc, context_dict) for errors the worker survives.
    "ON_ERROR": None,
    # Retention: None (never sweep), a cutoff for every terminal status,
    # {status: cutoff}, or a list of rule dicts (queue/status/name/older_than).
    "RETENTION": None,
    "SWEEP_INTERVAL": 60_000,
    "SWEEP_BATCH_SIZE": 1_000,
    "SWEEP_PAUSE": 50,
    # How often a worker refreshes its row in the workers table; it counts as
    # gone after three intervals without one.
    "WORKER_REPORT_INTERVAL": 10_000,
    # A secret that lets a scraper read the metrics view without a login
    # (sent as "Authorization: Bearer <token>"); None: staff with view permission only.
    "METRICS_TOKEN": None,
    # Trace enqueues and handler attempts with OpenTelemetry (needs opentelemetry-api).
    "OPENTELEMETRY": False,
    # Periodic tasks: {name: {"task": ..., "cron": ... or "every": ..., ...}}
    # (see cairnq_django/schedules/config.py); workers run them by default.
    "SCHEDULE": None,
    # Fleet-wide flow limits (flow/limits.py): a list of dicts, each naming one
    # of "queue", "name" or "key_prefix" and a "concurrency", a "rate" (starts
    # per "per", a timedelta or ms, default 1 s) or both.
    "LIMITS": [],
}

DURATION_KEYS = {
    "MAX_QUEUE_WAIT",
    "WAIT_POLL_INITIAL",
    "WAIT_POLL_MAX",
    "LEASE",
    "POLL_INTERVAL",
    "MAX_RUN",
    "SHUTDOWN_TIMEOUT",
    "WORKER_CONN_MAX_AGE",
    "WORKER_STATEMENT_TIMEOUT",
    "RETRY_BACKOFF_BASE",
    "RETRY_BACKOFF_CAP",
    "SWEEP_INTERVAL",
    "SWEEP_PAUSE",
    "WORKER_REPORT_INTERVAL",
}


def to_ms(value: Any) -> int | None:
    """Return a duration (timedelta or number of ms) as integer milliseconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected a timedelta or a number of milliseconds, got {value!r}.")
    return int(value)


class CairnQSettings:
    """Attribute access to settings.CAIRNQ merged over DEFAULTS."""

    # The one setting read everywhere, typed for the readers (__getattr__ serves it).
    DATABASE: str

    def user_settings(self) -> dict[str, Any]:
        return getattr(django_settings, "CAIRNQ", None) or {}

    def raw(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown CairnQ setting {name!r}.")
        return self.user_settings().get(name, DEFAULTS[name])

    def __getattr__(self, name: str) -> Any:
        if not name.isupper():
            raise AttributeError(name)
        value = self.raw(name)
        if name in DURATION_KEYS:
            return to_ms(value)
        return value

    def max_queue_depth(self, queue: str) -> int | None:
        limit: int | dict[str, int] | None = self.raw("MAX_QUEUE_DEPTH")
        if isinstance(limit, dict):
            return limit.get(queue, limit.get("*"))
        return limit


cairnq_settings = CairnQSettings()


def tasks_setting_in_use() -> bool:
    """Does settings.TASKS configure any backend (so a CairnQ one may be among them)?

    Without one nothing can build a task against a CairnQ backend, so the
    worker and the checks leave the Tasks framework unimported: on Django 5.2
    the django-tasks backport's import is a tenth of a worker's start-up.
    """
    return bool(getattr(django_settings, "TASKS", None))
