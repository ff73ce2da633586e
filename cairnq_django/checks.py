"""System checks for settings.CAIRNQ (its schedules among them) and the database it points at."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, cast

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import DEFAULT_DB_ALIAS
from django.utils.module_loading import import_string

from .conf import DEFAULTS, DURATION_KEYS, cairnq_settings, tasks_setting_in_use, to_ms
from .connection_options import connection_options_errors
from .flow.limit_parsing import limit_from_setting
from .retention import retention_config_errors
from .schedules.config import SETTING, Schedule, read_schedule
from .validators import is_integer

# Importing the Tasks framework registers its check, which runs each TASKS
# backend's check() (CairnQBackend's among them); with no TASKS there is none to run.
if tasks_setting_in_use():
    from . import compat as _compat  # noqa: F401

# RETURNING arrived in SQLite 3.35.0 (UPDATE ... FROM in 3.33.0); Django 5.2
# itself accepts 3.31.
MIN_SQLITE = (3, 35, 0)


@register(Tags.compatibility)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Report every settings.CAIRNQ value the queue cannot run with, before it runs."""
    errors: list[CheckMessage] = []
    user = cairnq_settings.user_settings()
    if not isinstance(user, dict):
        return [Error("settings.CAIRNQ must be a dict.", id="cairnq.E001")]
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            Error(
                f"settings.CAIRNQ has an unknown key {key!r}.",
                hint="Known keys: " + ", ".join(sorted(DEFAULTS)) + ".",
                id="cairnq.E002",
            )
        )
    for key in sorted(DURATION_KEYS & set(user)):
        if key in ("MAX_RUN", "WORKER_CONN_MAX_AGE", "WORKER_STATEMENT_TIMEOUT") and user[key] is None:
            continue
        try:
            value = to_ms(user[key])
        except TypeError:
            value = None
        if value is None or value < 0:
            errors.append(
                Error(
                    f"settings.CAIRNQ[{key!r}] must be a non-negative number of "
                    f"milliseconds or a timedelta, not {user[key]!r}.",
                    id="cairnq.E003",
                )
            )
        elif value == 0 and key in ("WAIT_POLL_INITIAL", "WAIT_POLL_MAX"):
            errors.append(
                Error(
                    f"settings.CAIRNQ[{key!r}] is 0, which would make wait() and call() "
                    "query the database in a tight loop.",
                    hint="Use at least 1 millisecond; the defaults are 100 and 500.",
                    id="cairnq.E003",
                )
            )
    errors += _check_queue_depth(user.get("MAX_QUEUE_DEPTH"))
    errors += [
        Error(f"settings.CAIRNQ[{key!r}] must be a positive integer, not {user[key]!r}.", id="cairnq.E005")
        for key in ("CONCURRENCY", "SWEEP_BATCH_SIZE", "LISTENERS")
        # LISTENERS may be None: every worker listens.
        if key in user and not is_integer(user[key]) and not (key == "LISTENERS" and user[key] is None)
    ]
    queues = user.get("QUEUES", DEFAULTS["QUEUES"])
    if not isinstance(queues, (list, tuple)) or not queues or not all(
        isinstance(q, str) and q for q in queues
    ):
        errors.append(
            Error(
                "settings.CAIRNQ['QUEUES'] must be a non-empty list of queue names.",
                id="cairnq.E006",
            )
        )
    on_error = user.get("ON_ERROR")
    if on_error is not None:
        try:
            hook = import_string(on_error)
        except ImportError as exc:
            hook = None
            errors.append(
                Error(
                    f"settings.CAIRNQ['ON_ERROR'] = {on_error!r} cannot be imported: {exc}",
                    hint="Give the dotted path of a callable(exc, context).",
                    id="cairnq.E007",
                )
            )
        if hook is not None and not callable(hook):
            errors.append(Error(f"{on_error!r} is not callable.", id="cairnq.E007"))
    errors += [
        Error(message, hint=hint, id="cairnq.E020")
        for message, hint in retention_config_errors(user.get("RETENTION"))
    ]
    errors += _check_limits(user.get("LIMITS", DEFAULTS["LIMITS"]))
    errors += [
        Error(message, hint=_CONNECTION_OPTIONS_HINT, id="cairnq.E050")
        for message in connection_options_errors(user.get("CONNECTION_OPTIONS"))
    ]
    return errors


_CONNECTION_OPTIONS_HINT = (
    'e.g. {"keepalives_idle": 10, "tcp_user_timeout": 15000}; None drops one default, '
    "False all of them (see docs/database-setup.md)."
)


_LIMITS_HINT = (
    'Each limit is a dict naming one of "queue", "name" or "key_prefix" and a positive '
    '"concurrency", a positive "rate" (starts per "per", a timedelta or ms, default 1 s), '
    'or both, e.g. {"name": "reports.generate", "concurrency": 3}.'
)


def _check_limits(entries: Any) -> list[CheckMessage]:
    """CAIRNQ["LIMITS"]: each entry valid (cairnq.E040), no scope and value twice (cairnq.E041)."""
    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        return [Error(
            f"settings.CAIRNQ['LIMITS'] must be a list of limits, not {entries!r}.",
            hint=_LIMITS_HINT, id="cairnq.E040",
        )]
    errors: list[CheckMessage] = []
    seen: dict[tuple[str, str], int] = {}
    for index, entry in enumerate(entries):
        try:
            limit = limit_from_setting(entry)
        except ValueError as exc:
            errors.append(Error(
                f"settings.CAIRNQ['LIMITS'][{index}] is invalid: {exc}", hint=_LIMITS_HINT,
                id="cairnq.E040",
            ))
            continue
        key = (limit.scope, limit.value)
        if key in seen:
            errors.append(Error(
                f"settings.CAIRNQ['LIMITS'][{index}] limits {limit.scope} {limit.value!r} again "
                f"(entry {seen[key]} already does).",
                hint="Give each queue, name or key prefix one entry, with its concurrency and rate together.",
                id="cairnq.E041",
            ))
        else:
            seen[key] = index
    return errors


def _check_queue_depth(limit: Any) -> list[CheckMessage]:
    if limit is None:
        return []
    limits = limit.values() if isinstance(limit, dict) else [limit]
    if all(is_integer(v) for v in limits):
        return []
    return [
        Error(
            f"settings.CAIRNQ['MAX_QUEUE_DEPTH'] = {limit!r} is invalid.",
            hint="Use None, a positive integer, or a dict of queue name to positive integer "
            "('*' for every other queue).",
            id="cairnq.E004",
        )
    ]


# Not tagged `database`: these read only settings, and Django runs database-tagged
# checks only when asked for a database (`check --database`), so a plain
# `manage.py check` or `runserver` would otherwise never report them.
@register(Tags.compatibility)
def check_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Check the queue's database alias and, for SQLite, its concurrency options."""
    if not isinstance(cairnq_settings.user_settings(), dict):
        return []  # cairnq.E001 already says so
    alias = cairnq_settings.DATABASE
    if not isinstance(alias, str) or alias not in settings.DATABASES:
        return [
            Error(
                f"settings.CAIRNQ['DATABASE'] names {alias!r}, which is not in "
                "settings.DATABASES.",
                hint="Name one of: " + ", ".join(sorted(settings.DATABASES)) + ".",
                id="cairnq.E010",
            )
        ]
    return database_errors(alias) + _router_errors(alias) + listen_database_errors(alias)


def listen_database_errors(alias: str) -> list[CheckMessage]:
    """CAIRNQ['LISTEN_DATABASE']: None, a PostgreSQL alias, or a libpq connection string."""
    target = cairnq_settings.LISTEN_DATABASE
    if target is None:
        return []
    hint = (
        "Name a PostgreSQL alias of settings.DATABASES, or give a libpq connection string "
        "such as 'host=db.internal port=5432' (its parameters replace the queue alias's)."
    )
    if not isinstance(target, str) or not target.strip():
        return [Error(
            f"settings.CAIRNQ['LISTEN_DATABASE'] must be None or a non-empty string, "
            f"not {target!r}.", hint=hint, id="cairnq.E014",
        )]
    if not str(settings.DATABASES[alias].get("ENGINE", "")).endswith("postgresql"):
        return [CheckWarning(
            "settings.CAIRNQ['LISTEN_DATABASE'] is set, but the CairnQ database "
            f"{alias!r} is not PostgreSQL; only PostgreSQL's wakeup LISTENs.",
            id="cairnq.W016",
        )]
    if target in settings.DATABASES:
        engine = str(settings.DATABASES[target].get("ENGINE", ""))
        if not engine.endswith("postgresql"):
            return [Error(
                f"settings.CAIRNQ['LISTEN_DATABASE'] names {target!r}, which uses {engine!r}; "
                "the listener needs PostgreSQL.", hint=hint, id="cairnq.E014",
            )]
        return []
    try:
        from psycopg.conninfo import conninfo_to_dict

        conninfo_to_dict(target)
    except ImportError:
        return []  # the wakeup itself needs psycopg and says so
    except Exception as exc:
        return [Error(
            f"settings.CAIRNQ['LISTEN_DATABASE'] = {target!r} is neither an alias of "
            f"settings.DATABASES nor a valid connection string ({exc}).",
            hint=hint, id="cairnq.E014",
        )]
    return []


def _router_errors(alias: str) -> list[CheckMessage]:
    if alias == DEFAULT_DB_ALIAS:
        return []
    routers = [
        router if isinstance(router, str) else f"{type(router).__module__}.{type(router).__name__}"
        for router in getattr(settings, "DATABASE_ROUTERS", [])
    ]
    if "cairnq_django.routers.CairnQRouter" in routers:
        return []
    return [
        CheckWarning(
            f"settings.CAIRNQ['DATABASE'] is {alias!r}, but CairnQRouter is not in "
            "settings.DATABASE_ROUTERS, so the admin and ORM look for the CairnQ tables in "
            "the default database and `migrate` creates them in every database.",
            hint="Add 'cairnq_django.routers.CairnQRouter' to DATABASE_ROUTERS, or route the "
            "cairnq_django app to that alias with a router of your own.",
            id="cairnq.W015",
        )
    ]


def database_errors(alias: str) -> list[CheckMessage]:
    """The engine and SQLite options of one database alias that concurrent workers need."""
    config = cast(dict[str, Any], settings.DATABASES[alias])
    engine = config.get("ENGINE", "")
    if engine.endswith("postgresql"):
        return []
    if not engine.endswith("sqlite3"):
        return [
            Error(
                f"The CairnQ database {alias!r} uses {engine!r}; cairnq_django supports "
                "SQLite and PostgreSQL.",
                id="cairnq.E011",
            )
        ]
    errors: list[CheckMessage] = []
    if sqlite3.sqlite_version_info < MIN_SQLITE:
        errors.append(
            Error(
                f"This Python links SQLite {sqlite3.sqlite_version}; cairnq_django needs "
                f"{'.'.join(map(str, MIN_SQLITE))} or newer (it writes with RETURNING and "
                "UPDATE ... FROM).",
                hint="Use a Python built against a newer SQLite (python.org and most current "
                "distributions ship 3.40+), or PostgreSQL.",
                id="cairnq.E013",
            )
        )
    options = config.get("OPTIONS", {})
    # EXCLUSIVE takes the write lock at BEGIN too (under WAL it is IMMEDIATE: readers go on).
    if str(options.get("transaction_mode", "")).upper() not in ("IMMEDIATE", "EXCLUSIVE"):
        errors.append(
            Error(
                f"SQLite database {alias!r} must open write transactions with "
                "BEGIN IMMEDIATE (or EXCLUSIVE), or concurrent workers see 'database is locked'.",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE'.",
                id="cairnq.E012",
            )
        )
    if "journal_mode=wal" not in str(options.get("init_command", "")).lower().replace(" ", ""):
        errors.append(
            CheckWarning(
                f"SQLite database {alias!r} does not set WAL journaling, so readers and "
                "the writer block each other.",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['init_command'] = "
                "'PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL'.",
                id="cairnq.W013",
            )
        )
    # Without the option Python's sqlite3 waits 5 s, which passes (README, W014).
    timeout = options.get("timeout", 5)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        errors.append(
            CheckWarning(
                f"SQLite database {alias!r} has OPTIONS['timeout'] = {timeout!r}, which is "
                "not a number of seconds.",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['timeout'] = 20 (seconds).",
                id="cairnq.W014",
            )
        )
    elif timeout < 5:
        errors.append(
            CheckWarning(
                f"SQLite database {alias!r} waits only {timeout!r} s for the write lock "
                "(under 5 s).",
                hint=f"Set DATABASES[{alias!r}]['OPTIONS']['timeout'] = 20 (seconds).",
                id="cairnq.W014",
            )
        )
    return errors


@register(Tags.compatibility)
def check_schedule(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """settings.CAIRNQ['SCHEDULE'] (cairnq.E030), and the tasks it names (cairnq.E031)."""
    user = cairnq_settings.user_settings()
    if not isinstance(user, dict) or user.get("SCHEDULE") is None:
        return []
    schedules, faults = read_schedule(user["SCHEDULE"])
    errors: list[CheckMessage] = [Error(str(fault), hint=fault.hint, id="cairnq.E030") for fault in faults]
    return errors + _unknown_task_errors(schedules)


def _unknown_task_errors(schedules: Sequence[Schedule]) -> list[CheckMessage]:
    """Schedules naming a task no handler in this project is registered for."""
    if not schedules:
        return []
    # Imported only when a schedule is set: a project without one loads no worker for its checks.
    from .worker.registry import autodiscover, registry

    autodiscover()
    known = set(registry.handlers)
    if not known:
        return []  # nothing registered here: the handlers may all live in peers
    return [
        Error(
            f"{SETTING}[{schedule.name!r}] enqueues task {schedule.task!r}, but no handler "
            "is registered under that name.",
            hint="Registered task names: " + ", ".join(sorted(known)) + ". If a worker of "
            "another CairnQ implementation runs it, silence this check with "
            "SILENCED_SYSTEM_CHECKS = ['cairnq.E031'].",
            id="cairnq.E031",
        )
        for schedule in schedules
        if schedule.task not in known
    ]
