"""Does a NOTIFY reach the listener? Asked at start and after each reconnect.

Behind PgBouncer in transaction pooling mode a LISTEN succeeds but the
notifications go to a server session the listener is no longer attached to,
so it hears nothing and every wait sleeps its full interval; nothing fails
loudly. The probe sends one notification the way producers do (a connection
of the queue's own alias, not the listener's) and expects the listener to
hear it within a few seconds; when it does not, one warning names the fix.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("cairnq_django.wakeup")

PROBE_CHANNEL = "cairnq_probe"
# How long a probe waits for its notification; a healthy server delivers in
# milliseconds, a loaded one within a second or two.
PROBE_TIMEOUT_S = 5.0

# (alias, listener target) pairs already warned about in this process: the
# warning is said once, not on every reconnect.
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class DeliveryProbe:
    """One listener's check that notifications sent by producers arrive."""

    def __init__(self, alias: str, target: str, send: Callable[[str], None]) -> None:
        self.alias = alias
        # Where the listener connects, as the warning should name it.
        self.target = target
        self._send = send
        self._token: str | None = None
        self._deadline = 0.0
        # None until a probe has been answered or has timed out.
        self.delivering: bool | None = None

    def start(self) -> None:
        """Send a new probe (the listener has just LISTENed)."""
        token = uuid.uuid4().hex
        self._token, self._deadline = token, time.monotonic() + PROBE_TIMEOUT_S
        try:
            self._send(token)
        except Exception as exc:  # the producer side is down: the listener learns soon enough
            logger.info("The CairnQ wakeup could not send its delivery probe (%s).", exc)
            self._token = None

    @property
    def pending(self) -> bool:
        """Whether a probe was sent and is neither heard nor timed out yet."""
        return self._token is not None

    def heard(self, payload: str) -> None:
        """A notification on PROBE_CHANNEL (other processes' probes arrive too)."""
        if self._token is not None and payload == self._token:
            self._token = None
            if self.delivering is False:
                logger.info(
                    "The CairnQ wakeup listener on database %r hears notifications again.",
                    self.alias,
                )
            self.delivering = True

    def check(self) -> None:
        """Call now and then while listening: warns once when a probe went unheard."""
        if self._token is None or time.monotonic() < self._deadline:
            return
        self._token = None
        self.delivering = False
        with _warned_lock:
            if (self.alias, self.target) in _warned:
                return
            _warned.add((self.alias, self.target))
        logger.warning(
            "The CairnQ wakeup listener for database %r (connected to %s) did not receive "
            "its own test notification within %.1fs: LISTEN/NOTIFY does not reach it, as "
            "happens behind PgBouncer in transaction pooling mode. Workers and wait() fall "
            "back to polling, so pickup is slower. Fix: give the listener a direct "
            "connection to PostgreSQL with settings.CAIRNQ['LISTEN_DATABASE'] (a DATABASES "
            "alias, or a connection string such as 'host=db.internal port=5432'); see "
            "'Behind PgBouncer' in docs/database-setup.md.",
            self.alias, self.target, PROBE_TIMEOUT_S,
        )


def describe(params: dict[str, Any]) -> str:
    """host:port/dbname of a psycopg parameter dict, for log lines (never the password)."""
    host = params.get("host") or "local socket"
    port = params.get("port") or 5432
    return f"{host}:{port}/{params.get('dbname') or ''}"


def forget_warnings() -> None:
    """Let the next unheard probe warn again (for tests)."""
    with _warned_lock:
        _warned.clear()
