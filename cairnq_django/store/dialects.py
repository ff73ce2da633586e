"""What differs between SQLite and PostgreSQL, and nothing else.

The store writes each statement once with a few placeholders; a dialect fills
them in. The differences are the clock (SQLite: the process supplies "now";
Postgres: the database clock, because hosts do not share one), JSON binding,
and row locking (Postgres claims with FOR UPDATE SKIP LOCKED; SQLite already
holds the single write lock for the whole BEGIN IMMEDIATE transaction).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ids import now_ms


@dataclass(frozen=True)
class Dialect:
    vendor: str
    now: str  # SQL for "now in epoch ms"
    json: str  # SQL wrapping a bound JSON text parameter
    skip_locked: str  # row-lock clause for claim/recover/purge subselects
    uses_process_clock: bool

    def bind_now(self, params: dict) -> dict:
        """Add the process clock to params when this dialect reads time from it."""
        if self.uses_process_clock:
            params["now_ms"] = now_ms()
        return params


SQLITE = Dialect(
    vendor="sqlite",
    now="%(now_ms)s",
    json="%({name})s",
    skip_locked="",
    uses_process_clock=True,
)

# The scalar subselect makes Postgres evaluate the volatile clock once per
# statement (an InitPlan), which keeps it usable as an index bound.
POSTGRES = Dialect(
    vendor="postgresql",
    now="(SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint)",
    json="%({name})s::jsonb",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    uses_process_clock=False,
)


def dialect_for(vendor: str) -> Dialect:
    if vendor == "sqlite":
        return SQLITE
    if vendor == "postgresql":
        return POSTGRES
    raise NotImplementedError(f"cairnq_django supports SQLite and PostgreSQL, not {vendor!r}.")
