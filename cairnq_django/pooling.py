"""Django's connection pool (DATABASES[...]["OPTIONS"]["pool"], Django >= 5.1, psycopg_pool).

On a pooled alias a thread's connection is borrowed from a pool of a fixed
size, and close() gives it back rather than ending the session. A thread that
keeps its connection while it sleeps or waits holds a pool slot nobody else
can use; with a pool smaller than the worker's thread count that starves
(or deadlocks) the others. So the worker's long-lived threads give a pooled
connection back after each unit of work: a claim, a heartbeat, a group of
completions, a tick, a handler call. Unpooled aliases keep theirs
(connections.py) because reconnecting costs more than most tasks.
"""

from __future__ import annotations

from contextlib import suppress

from django.db import connections


def is_pooled(alias: str) -> bool:
    """Whether `alias` uses Django's connection pool."""
    options = connections.settings[alias].get("OPTIONS") or {}
    return bool(options.get("pool"))


def release(alias: str) -> None:
    """Give this thread's connection of a pooled `alias` back to its pool (no-op otherwise).

    Never inside a transaction: closing would cut it short.
    """
    if alias not in connections.settings or not is_pooled(alias):
        return
    _give_back(alias)


def release_all() -> None:
    """Give back this thread's connections of every pooled alias it has opened."""
    for connection in connections.all(initialized_only=True):
        if is_pooled(connection.alias):
            _give_back(connection.alias)


def _give_back(alias: str) -> None:
    connection = connections[alias]
    if connection.connection is None or connection.in_atomic_block:
        return
    with suppress(Exception):  # a broken connection is discarded by the pool
        connection.close()
