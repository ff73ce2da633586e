"""The CairnQ tables at schema_version 10, as DDL for each database vendor.

Django owns the order in which this runs (migration 0001), but the tables are
the protocol's: peers in other languages read and write them, so every column,
constraint and index here mirrors what `cairnq` 0.15.1 creates. Statements are
idempotent so that migrating a database a peer already set up changes nothing.
"""

from __future__ import annotations

from .ids import now_ms

PROTOCOL_VERSION = 1
SCHEMA_VERSION = 10

# The peers' own migration ledger. Recording every upstream file as applied
# tells a connecting peer the schema is current, so it runs no DDL against
# tables Django owns. SQLite never had a 0003 (the notify trigger is Postgres-only).
UPSTREAM_MIGRATIONS = {
    "sqlite": (
        "0001_init.sql",
        "0002_purge_index.sql",
        "0004_lease_index.sql",
        "0005_clear_terminal_lease.sql",
        "0006_claim_name_index.sql",
        "0007_purge_status_index.sql",
        "0008_claim_due_index.sql",
        "0009_purge_queue_index.sql",
        "0010_drop_status_index.sql",
    ),
    "postgresql": (
        "0001_init.sql",
        "0002_purge_index.sql",
        "0003_notify.sql",
        "0004_lease_index.sql",
        "0005_clear_terminal_lease.sql",
        "0006_claim_name_index.sql",
        "0007_purge_status_index.sql",
        "0008_claim_due_index.sql",
        "0009_purge_queue_index.sql",
        "0010_drop_status_index.sql",
    ),
}

_SQLITE_TABLES = [
    """
    CREATE TABLE IF NOT EXISTS cairnq_tasks (
        id text PRIMARY KEY,
        name text NOT NULL,
        queue text NOT NULL DEFAULT 'default',
        status text NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'canceled')),
        payload text NOT NULL CHECK (json_valid(payload)),
        result text CHECK (result IS NULL OR json_valid(result)),
        error text CHECK (error IS NULL OR json_valid(error)),
        metadata text NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
        progress real,
        message text,
        attempt integer NOT NULL DEFAULT 0,
        max_attempts integer NOT NULL DEFAULT 3,
        priority integer NOT NULL DEFAULT 0,
        worker_id text,
        lease_until_ms integer,
        run_at_ms integer NOT NULL,
        cancel_requested_at_ms integer,
        parent_id text,
        root_id text,
        correlation_id text,
        created_at_ms integer NOT NULL,
        updated_at_ms integer NOT NULL,
        completed_at_ms integer
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS cairnq_task_keys (
        key text PRIMARY KEY,
        task_id text NOT NULL REFERENCES cairnq_tasks(id) ON DELETE CASCADE,
        created_at_ms integer NOT NULL,
        updated_at_ms integer NOT NULL
    )
    """,
    "CREATE TABLE IF NOT EXISTS cairnq_meta (key text PRIMARY KEY, value text NOT NULL)",
    """
    CREATE TABLE IF NOT EXISTS cairnq_migrations (
        name text PRIMARY KEY, applied_at_ms integer NOT NULL
    )
    """,
]

_POSTGRES_TABLES = [
    """
    CREATE TABLE IF NOT EXISTS cairnq_tasks (
        id text PRIMARY KEY,
        name text NOT NULL,
        queue text NOT NULL DEFAULT 'default',
        status text NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'canceled')),
        payload jsonb NOT NULL,
        result jsonb,
        error jsonb,
        metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
        progress double precision,
        message text,
        attempt integer NOT NULL DEFAULT 0,
        max_attempts integer NOT NULL DEFAULT 3,
        priority integer NOT NULL DEFAULT 0,
        worker_id text,
        lease_until_ms bigint,
        run_at_ms bigint NOT NULL,
        cancel_requested_at_ms bigint,
        parent_id text,
        root_id text,
        correlation_id text,
        created_at_ms bigint NOT NULL,
        updated_at_ms bigint NOT NULL,
        completed_at_ms bigint
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS cairnq_task_keys (
        key text PRIMARY KEY,
        task_id text NOT NULL REFERENCES cairnq_tasks(id) ON DELETE CASCADE,
        created_at_ms bigint NOT NULL,
        updated_at_ms bigint NOT NULL
    )
    """,
    "CREATE TABLE IF NOT EXISTS cairnq_meta (key text PRIMARY KEY, value text NOT NULL)",
    """
    CREATE TABLE IF NOT EXISTS cairnq_migrations (
        name text PRIMARY KEY, applied_at_ms bigint NOT NULL
    )
    """,
]

# Shared by both vendors: the index set of schema 10. Partial predicates are
# spelled exactly as the claim/recovery/purge statements spell their WHERE
# terms, because SQLite only uses a partial index it can match syntactically.
_INDEXES = [
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_claim_idx"
    " ON cairnq_tasks (queue, status, priority DESC, run_at_ms, id)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_claim_name_idx"
    " ON cairnq_tasks (queue, status, name, priority DESC, run_at_ms, id)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_name_idx ON cairnq_tasks (name)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_root_idx ON cairnq_tasks (root_id)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_correlation_idx ON cairnq_tasks (correlation_id)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_completed_idx ON cairnq_tasks (completed_at_ms)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_status_completed_idx"
    " ON cairnq_tasks (status, completed_at_ms)",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_lease_idx ON cairnq_tasks (lease_until_ms)"
    " WHERE status = 'running' AND lease_until_ms IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS cairnq_tasks_queue_completed_idx"
    " ON cairnq_tasks (queue, completed_at_ms)"
    " WHERE status IN ('succeeded', 'failed', 'canceled')",
]

# Wakes LISTENers; they only use it to cut a poll sleep short. The WHEN clause
# keeps the most frequent status write (claim, into 'running') out of plpgsql.
_POSTGRES_NOTIFY = [
    """
    CREATE OR REPLACE FUNCTION cairnq_notify() RETURNS trigger AS $$
    BEGIN
        IF new.status = 'queued'
           AND (tg_op = 'INSERT' OR old.status IS DISTINCT FROM new.status) THEN
            PERFORM pg_notify('cairnq_queued', new.queue);
        ELSIF tg_op = 'UPDATE'
              AND new.status IN ('succeeded', 'failed', 'canceled')
              AND old.status NOT IN ('succeeded', 'failed', 'canceled') THEN
            PERFORM pg_notify('cairnq_done', new.id);
        END IF;
        RETURN NULL;
    END;
    $$ LANGUAGE plpgsql
    """,
    "DROP TRIGGER IF EXISTS cairnq_tasks_notify ON cairnq_tasks",
    """
    CREATE TRIGGER cairnq_tasks_notify
    AFTER INSERT OR UPDATE OF status ON cairnq_tasks
    FOR EACH ROW
    WHEN (new.status IS DISTINCT FROM 'running')
    EXECUTE FUNCTION cairnq_notify()
    """,
]

_META_ROWS = [
    (
        "INSERT INTO cairnq_meta (key, value) VALUES ('protocol_version', %s)"
        " ON CONFLICT (key) DO NOTHING",
        [str(PROTOCOL_VERSION)],
    ),
    (
        "INSERT INTO cairnq_meta (key, value) VALUES ('schema_version', %s)"
        # DO NOTHING: a newer peer may already have moved the schema on.
        " ON CONFLICT (key) DO NOTHING",
        [str(SCHEMA_VERSION)],
    ),
]


def installed_schema_version(cursor, vendor: str) -> int | None:
    """Return the schema_version already recorded in this database, or None if there is none."""
    if vendor == "postgresql":
        cursor.execute("SELECT to_regclass('cairnq_meta') IS NOT NULL")
    else:
        cursor.execute(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'cairnq_meta'"
        )
    if not cursor.fetchone()[0]:
        return None
    cursor.execute("SELECT value FROM cairnq_meta WHERE key = 'schema_version'")
    row = cursor.fetchone()
    return int(row[0]) if row else None


def refuse_outdated_schema(cursor, vendor: str) -> None:
    """Raise if a peer already installed an older schema this migration cannot upgrade.

    Our DDL is idempotent, not incremental: over a schema-7 installation it
    would leave the old claim indexes in place while recording every upstream
    migration as applied, so no peer would ever rebuild them.
    """
    version = installed_schema_version(cursor, vendor)
    if version is not None and version < SCHEMA_VERSION:
        raise RuntimeError(
            f"This database already holds CairnQ tables at schema_version {version}, created "
            f"by another CairnQ implementation; cairnq_django needs {SCHEMA_VERSION}. Upgrade "
            "them first by connecting cairnq>=0.15 (or another peer at schema 10) once, then "
            "run migrate again."
        )


def create_statements(vendor: str) -> list[tuple[str, list]]:
    """Return (sql, params) pairs that bring an empty database to schema 10."""
    if vendor == "sqlite":
        ddl = _SQLITE_TABLES + ["DROP INDEX IF EXISTS cairnq_tasks_status_idx"] + _INDEXES
    elif vendor == "postgresql":
        ddl = (
            _POSTGRES_TABLES
            + ["DROP INDEX IF EXISTS cairnq_tasks_status_idx"]
            + _INDEXES
            + _POSTGRES_NOTIFY
        )
    else:
        raise NotImplementedError(
            f"cairnq_django supports SQLite and PostgreSQL, not {vendor!r}."
        )
    statements = [(sql.strip(), []) for sql in ddl] + list(_META_ROWS)
    for name in UPSTREAM_MIGRATIONS[vendor]:
        if vendor == "postgresql":
            clock, params = "(extract(epoch from clock_timestamp()) * 1000)::bigint", [name]
        else:
            clock, params = "%s", [name, now_ms()]
        statements.append(
            (
                f"INSERT INTO cairnq_migrations (name, applied_at_ms) VALUES (%s, {clock})"
                " ON CONFLICT (name) DO NOTHING",
                params,
            )
        )
    return statements


def drop_statements(vendor: str) -> list[str]:
    """Return the DDL that removes every CairnQ object (the migration's reverse)."""
    statements = [
        "DROP TABLE IF EXISTS cairnq_task_keys",
        "DROP TABLE IF EXISTS cairnq_tasks",
        "DROP TABLE IF EXISTS cairnq_meta",
        "DROP TABLE IF EXISTS cairnq_migrations",
    ]
    if vendor == "postgresql":
        statements.append("DROP FUNCTION IF EXISTS cairnq_notify()")
    return statements
