"""Database connection lifetime for worker threads.

Django's CONN_MAX_AGE defaults to 0 because a web request is a natural place to
close a connection. A worker thread runs task after task, and on PostgreSQL a
fresh connection per task costs more than a typical task, so while a worker
runs it keeps connections for WORKER_CONN_MAX_AGE instead, with Django's health
checks on so a connection the server dropped is replaced before it is used.

An alias with Django's connection pool (OPTIONS["pool"]) is left alone: Django
refuses a pool with a persistent CONN_MAX_AGE, and the pool already keeps the
sessions open; the worker gives pooled connections back instead (pooling.py).

On PostgreSQL the aliases also get CairnQ's TCP options while the worker runs
(connection_options.py), so a connection the network stopped carrying is
dropped in seconds, not when TCP gives up.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from ..conf import cairnq_settings
from ..connection_options import is_postgres, with_connection_options
from ..pooling import is_pooled

_ABSENT = object()  # a key the alias's settings did not have


def statement_timeout_ms(lease_ms: int) -> int | None:
    """The statement timeout of the worker's own statements: WORKER_STATEMENT_TIMEOUT or lease/3.

    A third of the lease, like the heartbeat's interval: a renewal stuck that
    long is cut off with a beat of slack left before the lease runs out.
    """
    setting = cairnq_settings.WORKER_STATEMENT_TIMEOUT
    if setting is None:
        return max(1, lease_ms // 3)
    return setting or None


class WorkerConnectionPolicy:
    """Raise CONN_MAX_AGE=0 aliases to the worker's lifetime and give PostgreSQL aliases
    CairnQ's TCP options while it runs; restore on exit.

    Set in the alias's settings before the worker's threads connect, so every
    connection they open (and reopen after an outage) carries them.
    """

    def __init__(self) -> None:
        # (an alias's settings, a key, its value before): restored in reverse order.
        self._saved: list[tuple[dict[str, Any], str, object]] = []

    def _set(self, config: dict[str, Any], key: str, value: object) -> None:
        self._saved.append((config, key, config.get(key, _ABSENT)))
        config[key] = value

    def apply(self) -> None:
        for alias in connections.settings:
            if is_postgres(alias):
                config = connections.settings[alias]
                self._set(config, "OPTIONS", with_connection_options(alias, config.get("OPTIONS") or {}))
        lifetime_ms = cairnq_settings.WORKER_CONN_MAX_AGE
        if lifetime_ms is None:
            return
        for alias in connections.settings:
            config = connections.settings[alias]
            if config.get("CONN_MAX_AGE", 0) != 0:
                continue  # the project chose a lifetime; keep it
            if is_pooled(alias):
                continue  # the pool keeps the sessions; Django refuses CONN_MAX_AGE with it
            self._set(config, "CONN_MAX_AGE", lifetime_ms / 1000)
            self._set(config, "CONN_HEALTH_CHECKS", True)

    def restore(self) -> None:
        while self._saved:
            config, key, old = self._saved.pop()
            if old is _ABSENT:
                config.pop(key, None)
            else:
                config[key] = old
