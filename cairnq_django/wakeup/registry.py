"""One Wakeup per process and database alias, of the kind the database's dialect supports.

Workers and wait()/call() both take their wakeup from here, so a process
holds one listener (or one poller) per alias however many wait on it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..conf import cairnq_settings
from ..db.dialects import dialect_for
from .base import Wakeup

logger = logging.getLogger("cairnq_django.wakeup")

_registry: dict[str, Wakeup] = {}
_registry_lock = threading.Lock()


def _forget_after_fork() -> None:
    """In a forked child the parent's threads and sockets do not exist."""
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()  # a parent thread may have held it at the fork


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere nothing forks
    os.register_at_fork(after_in_child=_forget_after_fork)


def build_wakeup(alias: str) -> Wakeup:
    """A new Wakeup for `alias`: LISTEN, a watched file, or plain sleeps."""
    if not cairnq_settings.WAKEUPS:
        return Wakeup()
    connection = connections[alias]
    try:
        dialect = dialect_for(connection)
        if dialect.has_listen_notify:
            import psycopg  # noqa: F401  (psycopg2 projects get plain sleeps)

            from .postgres import PostgresWakeup, listen_params

            return PostgresWakeup(
                listen_params(alias), probe_alias=alias, seats=cairnq_settings.LISTENERS
            )
        path = _database_file(connection) if dialect.watches_database_file else None
        if path is not None:
            from .sqlite import SQLiteWakeup

            return SQLiteWakeup(path, using=alias)
    except Exception as exc:
        logger.warning(
            "CairnQ wakeups are off for database %r (%s); waits fall back to sleeping.",
            alias,
            exc,
        )
    return Wakeup()


def _database_file(connection: BaseDatabaseWrapper) -> str | None:
    """The file a watch can follow; None for an in-memory database."""
    in_memory = getattr(connection, "is_in_memory_db", None)
    if in_memory is None or in_memory():
        return None
    return str(connection.settings_dict["NAME"])


def get_wakeup(alias: str | None = None) -> Wakeup:
    """Return this process's Wakeup for a database alias, creating it on first use."""
    alias = alias or cairnq_settings.DATABASE
    with _registry_lock:
        wakeup = _registry.get(alias)
        if wakeup is None or wakeup.closed:
            wakeup = _registry[alias] = build_wakeup(alias)
        return wakeup


@contextmanager
def use_wakeup(alias: str, wakeup: Wakeup) -> Iterator[Wakeup]:
    """Make get_wakeup(alias) return `wakeup` inside the block (for tests)."""
    with _registry_lock:
        saved = _registry.get(alias)
        _registry[alias] = wakeup
    try:
        yield wakeup
    finally:
        with _registry_lock:
            if saved is None:
                _registry.pop(alias, None)
            else:
                _registry[alias] = saved


def close_all() -> None:
    """Close every wakeup of this process (tests call it before dropping the database)."""
    with _registry_lock:
        wakeups = list(_registry.values())
        _registry.clear()
    for wakeup in wakeups:
        wakeup.close()


atexit.register(close_all)
