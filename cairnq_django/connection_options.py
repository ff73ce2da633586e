"""TCP options for the connections the worker, the listener and wait() keep open.

A connection to PostgreSQL that the network stops carrying (a blackhole: a
host moved, a NAT or firewall entry dropped) is not closed by anyone. Without
keepalives an idle socket waits for ever, and a socket with unacknowledged
data waits for TCP's retransmissions to give up, about 15 minutes on Linux.
Meanwhile a worker holds its tasks and claims nothing. So these connections
get libpq's keepalives (an idle connection is probed after 4 s, every 1 s,
and dropped after 3 probes go unanswered: about 7 s) and tcp_user_timeout (a
connection with data unacknowledged for 7 s is dropped), both well under the
default 30 s lease, and connect_timeout (a connect that gets no answer gives
up after 5 s and is retried, instead of hanging on the dead path).

The defaults are merged under the alias's own OPTIONS, so a value the
project set there wins; CAIRNQ["CONNECTION_OPTIONS"] replaces single
defaults (None removes one) or, set to False, turns them all off. PostgreSQL
only: SQLite has no network.
"""

from __future__ import annotations

import socket
from contextlib import suppress
from typing import Any

from django.db import connections

from .conf import cairnq_settings
from .validators import is_integer

DEFAULT_CONNECTION_OPTIONS: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 4,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 7_000,
    "connect_timeout": 5,
}


def connection_options() -> dict[str, Any]:
    """The libpq parameters CairnQ adds: the defaults with CAIRNQ["CONNECTION_OPTIONS"] applied."""
    setting = cairnq_settings.CONNECTION_OPTIONS
    if setting is False:
        return {}
    merged: dict[str, Any] = dict(DEFAULT_CONNECTION_OPTIONS)
    for key, value in (setting or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def is_postgres(alias: str) -> bool:
    return connections[alias].vendor == "postgresql"


def with_connection_options(alias: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` (an alias's OPTIONS) with CairnQ's defaults under it; a copy."""
    if not is_postgres(alias):
        return dict(options)
    return {**connection_options(), **options}


# libpq's keepalive and tcp_user_timeout parameters, as socket options.
_KEEPALIVE_OPTIONS = (
    ("keepalives_idle", "TCP_KEEPIDLE"),
    ("keepalives_interval", "TCP_KEEPINTVL"),
    ("keepalives_count", "TCP_KEEPCNT"),
)


def apply_to_open_connection(alias: str) -> None:
    """Set the keepalive and user-timeout options on the socket of this thread's open connection.

    wait() runs on the caller's own connection, opened with the caller's
    OPTIONS; it cannot reopen it with other parameters, so it sets on the
    socket what libpq would have. Options the alias already sets are left to
    it. A no-op for SQLite, for a closed connection, and where the platform
    lacks a socket option.
    """
    if not is_postgres(alias):
        return
    wrapper = connections[alias]
    raw = wrapper.connection
    if raw is None:
        return
    own = wrapper.settings_dict.get("OPTIONS") or {}
    wanted = {k: v for k, v in connection_options().items() if k not in own}
    settings: list[tuple[int, int, int]] = []
    if wanted.get("keepalives") and "keepalives" not in own:
        settings.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
        settings += [
            (socket.IPPROTO_TCP, getattr(socket, name), int(wanted[key]))
            for key, name in _KEEPALIVE_OPTIONS
            if key in wanted and hasattr(socket, name)
        ]
    if "tcp_user_timeout" in wanted and hasattr(socket, "TCP_USER_TIMEOUT"):
        settings.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(wanted["tcp_user_timeout"])))
    if not settings:
        return
    with suppress(Exception):  # best effort: the wait works without them
        sock = socket.socket(fileno=raw.fileno())
        try:
            for level, option, value in settings:
                sock.setsockopt(level, option, value)
        finally:
            sock.detach()  # the socket stays libpq's


def connection_options_errors(setting: Any) -> list[str]:
    """What is wrong with a CAIRNQ["CONNECTION_OPTIONS"] value (for the system check)."""
    if setting is None or setting is False:
        return []
    if not isinstance(setting, dict):
        return [
            f"settings.CAIRNQ['CONNECTION_OPTIONS'] must be a dict of libpq parameters or "
            f"False, not {setting!r}."
        ]
    errors = []
    for key, value in setting.items():
        if not isinstance(key, str) or not key:
            errors.append(f"settings.CAIRNQ['CONNECTION_OPTIONS'] has a key {key!r} that is not a name.")
        elif key in DEFAULT_CONNECTION_OPTIONS and value is not None and not is_integer(value, minimum=0):
            errors.append(
                f"settings.CAIRNQ['CONNECTION_OPTIONS'][{key!r}] must be a non-negative "
                f"integer or None, not {value!r}."
            )
    return errors
