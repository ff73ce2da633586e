"""What differs between SQLite and PostgreSQL, as capability flags.

Every other module asks a dialect what the database can do (`has_row_locks`,
`has_listen_notify`, ...) instead of comparing `connection.vendor`, the way
Django's own backends expose `features.supports_*`. Django's backends already
carry most differences (placeholders, RETURNING, LIMIT in subqueries); these
flags are the ones the queue adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

# Free-text columns a foreign writer fills. On SQLite they are read as bytes:
# Python's sqlite3 raises on TEXT that is not UTF-8 while fetching the row, so
# one bad value would fail the whole statement (a claim, a listing) rather
# than the one task; the codec decodes bytes and reports what it cannot.
RAW_TEXT_COLUMNS = ("payload", "result", "error", "metadata", "message")


_PEER_MIGRATIONS = (
    "0001_init.sql",
    "0002_purge_index.sql",
    "0004_lease_index.sql",
    "0005_clear_terminal_lease.sql",
    "0006_claim_name_index.sql",
    "0007_purge_status_index.sql",
    "0008_claim_due_index.sql",
    "0009_purge_queue_index.sql",
    "0010_drop_status_index.sql",
)


@dataclass(frozen=True)
class Dialect:
    vendor: str
    # "Now" comes from this process (SQLite, one host) rather than from the
    # database clock (PostgreSQL, where workers on many hosts share it).
    uses_process_clock: bool
    # Claims lock rows and skip locked ones (FOR UPDATE SKIP LOCKED); without
    # it the database serializes every writer (SQLite's single write lock).
    has_row_locks: bool
    # One writer at a time: a worker's threads take turns at the write lock
    # through an in-process gate instead of SQLite's sleeping busy handler.
    serializes_writes: bool
    # Keyed submits serialize through pg_advisory_xact_lock, as the peers do.
    has_advisory_locks: bool
    # Wakeups: LISTEN/NOTIFY, or else a watched database file.
    has_listen_notify: bool
    watches_database_file: bool
    # Several statements travel as one query string (the simple protocol),
    # and large batches stream through COPY FROM STDIN: the store takes the
    # round-trip variants of store/postgres_engine.py, chosen once per alias.
    has_round_trip_engine: bool
    # A commit may skip its WAL flush (SET LOCAL synchronous_commit TO OFF).
    has_async_commit: bool
    # A cheap row-count estimate from the catalog (pg_class.reltuples).
    has_row_estimate: bool
    # Rows carry an insertion-ordered rowid that single-column indexes end in.
    has_rowid: bool
    # ANALYZE / PRAGMA optimize keeps the planner on the lease index.
    needs_periodic_analyze: bool
    # Every claim leaves the claimed rows' old index entries at the head of
    # the claim index, where only VACUUM removes them (worker/upkeep.py).
    needs_claim_vacuum: bool
    # The queue table's storage parameters (ALTER TABLE ... SET), set by
    # migration 0008; docs/database-setup.md gives each value's reason.
    queue_table_storage: tuple[tuple[str, str], ...]
    # Django's cursor binds named parameters faster than positional ones
    # (statement_cache.py).
    binds_by_name: bool
    # Column types spelled as the peers spell them where Django's differ.
    text_type: str | None
    epoch_millis_type: str | None
    # The catalog query "does {table} exist", for plain cursors (a peer's
    # database that no Django alias names); {table} is a constant.
    table_exists_sql: str
    # The peers' own migration ledger (cairnq_migrations) at schema 10.
    peer_migrations: tuple[str, ...]


SQLITE = Dialect(
    vendor="sqlite",
    uses_process_clock=True,
    has_row_locks=False,
    serializes_writes=True,
    has_advisory_locks=False,
    has_listen_notify=False,
    watches_database_file=True,
    has_round_trip_engine=False,
    has_async_commit=False,
    has_row_estimate=False,
    has_rowid=True,
    needs_periodic_analyze=True,
    needs_claim_vacuum=False,
    queue_table_storage=(),
    binds_by_name=True,
    text_type=None,
    epoch_millis_type="integer",
    table_exists_sql="SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = '{table}'",
    peer_migrations=_PEER_MIGRATIONS,
)

POSTGRES = Dialect(
    vendor="postgresql",
    uses_process_clock=False,
    has_row_locks=True,
    serializes_writes=False,
    has_advisory_locks=True,
    has_listen_notify=True,
    watches_database_file=False,
    has_round_trip_engine=True,
    has_async_commit=True,
    has_row_estimate=True,
    has_rowid=False,
    needs_periodic_analyze=False,
    needs_claim_vacuum=True,
    # Autovacuum as close to the claims as its schedule allows, for dead rows
    # the worker's own VACUUM leaves (a role that may not, peers that never do):
    queue_table_storage=(
        # a fixed count of dead rows (~5,000 tasks: a claim and a settle leave
        # one each), not 20% of a table that may keep a million finished rows;
        ("autovacuum_vacuum_scale_factor", "0"),
        ("autovacuum_vacuum_threshold", "10000"),
        # one quick pass rather than a throttled one holding the table's
        # VACUUM lock (while it holds it, the worker's VACUUM is skipped);
        ("autovacuum_vacuum_cost_delay", "0"),
        # always through the indexes: the claim index's dead entries are why.
        ("vacuum_index_cleanup", "on"),
    ),
    binds_by_name=False,
    # TEXT, not Django's "text": Django adds a text_pattern_ops index to every
    # indexed column whose type it spells "text", and the protocol has none.
    text_type="TEXT",
    epoch_millis_type=None,
    table_exists_sql="SELECT to_regclass('{table}') IS NOT NULL",
    # Only PostgreSQL has the notify trigger.
    peer_migrations=tuple(sorted((*_PEER_MIGRATIONS, "0003_notify.sql"))),
)

_BY_VENDOR = {"sqlite": SQLITE, "postgresql": POSTGRES}


def dialect_for(connection_or_vendor: BaseDatabaseWrapper | str) -> Dialect:
    """The dialect of a Django connection (or of a vendor name)."""
    vendor = connection_or_vendor if isinstance(connection_or_vendor, str) else connection_or_vendor.vendor
    try:
        return _BY_VENDOR[vendor]
    except KeyError:
        raise NotImplementedError(
            f"cairnq_django supports SQLite and PostgreSQL, not {vendor!r}."
        ) from None


def dialect_of(using: str) -> Dialect:
    """The dialect of a database alias."""
    return dialect_for(connections[using])
