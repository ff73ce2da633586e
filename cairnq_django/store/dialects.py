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
from ..records import COLUMNS

# Free-text columns a foreign writer fills. On SQLite they are read as bytes:
# Python's sqlite3 raises on TEXT that is not UTF-8 while fetching the row, so
# one bad value would fail the whole statement (a claim, a listing) rather
# than the one task; the codec decodes bytes and reports what it cannot.
_RAW_TEXT_COLUMNS = frozenset({"payload", "result", "error", "metadata", "message"})


@dataclass(frozen=True)
class Dialect:
    vendor: str
    now: str  # SQL for "now in epoch ms"
    json: str  # SQL wrapping a bound JSON text parameter
    skip_locked: str  # row-lock clause for claim/recover/purge subselects
    uses_process_clock: bool
    # Does a fetched TEXT value that is not UTF-8 fail the statement?
    fails_on_bad_text: bool

    def task_columns(self, table: str = "") -> str:
        """The select list of a whole task row (`table` qualifies it, as in `t.*`)."""
        prefix = f"{table}." if table else ""
        if not self.fails_on_bad_text:
            return f"{prefix}*"
        return ", ".join(
            f"CAST({prefix}{c} AS BLOB) AS {c}" if c in _RAW_TEXT_COLUMNS else f"{prefix}{c}"
            for c in COLUMNS
        )

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
    fails_on_bad_text=True,
)

# The scalar subselect makes Postgres evaluate the volatile clock once per
# statement (an InitPlan), which keeps it usable as an index bound.
POSTGRES = Dialect(
    vendor="postgresql",
    now="(SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint)",
    json="%({name})s::jsonb",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    uses_process_clock=False,
    fails_on_bad_text=False,
)


def dialect_for(vendor: str) -> Dialect:
    if vendor == "sqlite":
        return SQLITE
    if vendor == "postgresql":
        return POSTGRES
    raise NotImplementedError(f"cairnq_django supports SQLite and PostgreSQL, not {vendor!r}.")
