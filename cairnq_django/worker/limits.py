"""The limits a worker claims under, re-read about once a second while it claims.

Reading them costs a query; an idle worker reads nothing (the claim loop
asks only once its probe found work), and a busy one at most once per
REREAD_S, so a limit set or cleared at run time reaches every worker within
about a second.
"""

from __future__ import annotations

import time

from django.core.exceptions import ImproperlyConfigured

from ..flow.limits import effective_limits, settings_limits
from ..records import Limit

REREAD_S = 1.0


class LimitsCache:
    """effective_limits() for one alias, read again once REREAD_S has passed."""

    def __init__(self, using: str) -> None:
        self.using = using
        # Invalid CAIRNQ["LIMITS"] stops the worker at start (the system
        # checks say the same, with each entry's position).
        try:
            settings_limits()
        except ValueError as exc:
            raise ImproperlyConfigured(f'Invalid CAIRNQ["LIMITS"]: {exc}') from exc
        self._limits: list[Limit] = []
        self._read_at: float | None = None

    def current(self) -> list[Limit]:
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= REREAD_S:
            self._limits = effective_limits(self.using)
            self._read_at = now
        return self._limits
