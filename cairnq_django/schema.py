"""What the migrations do beyond the models: adopt a peer's tables, and the protocol's rows.

The models declare the tables (see models/protocol.py). Three things have no Django
field or option, and live here for the migrations to call:

- A database a peer (the `cairnq` SDK, the TypeScript SDK) set up first
  already has the tables. Migrating it verifies them against the models,
  through the catalog, and changes nothing; any other schema version is
  refused with what to do, and nothing is changed either.
- PostgreSQL's notify trigger, which wakes listeners when a task is queued or
  finishes.
- The `cairnq_meta` rows and the peers' `cairnq_migrations` ledger, which tell
  a connecting peer that the schema is current, so it runs no DDL of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from django.apps.registry import Apps
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import Model
from django.db.models.fields.related import RelatedField

from .db.dialects import POSTGRES, SQLITE, dialect_for
from .db.expressions import NowMs
from .records import PROTOCOL_VERSION, SCHEMA_VERSION

# The peers' own migration ledger at schema 10, by database.
UPSTREAM_MIGRATIONS = {dialect.vendor: dialect.peer_migrations for dialect in (SQLITE, POSTGRES)}

PROTOCOL_MODELS = ("PeerMigration", "ProtocolMeta", "Task", "TaskKey")

# Wakes LISTENers; they only use it to cut a poll sleep short. The WHEN clause
# keeps the most frequent status write (claim, into 'running') out of plpgsql.
NOTIFY_FUNCTION = """
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
"""
NOTIFY_TRIGGER = """
CREATE TRIGGER cairnq_tasks_notify
AFTER INSERT OR UPDATE OF status ON cairnq_tasks
FOR EACH ROW
WHEN (new.status IS DISTINCT FROM 'running')
EXECUTE FUNCTION cairnq_notify()
"""


class SchemaMismatch(RuntimeError):
    """The database holds CairnQ tables this app cannot adopt unchanged."""


class Cursor(Protocol):
    """A Django cursor or a driver's own (the version is also read where no alias exists)."""

    def execute(self, sql: str) -> object: ...

    def fetchone(self) -> Any: ...


def installed_schema_version(cursor: Cursor, vendor: str) -> int | None:
    """Return the schema_version already recorded in this database, or None if there is none.

    Plain cursors, not the ORM: this also reads databases no Django alias names.
    """
    cursor.execute(dialect_for(vendor).table_exists_sql.format(table="cairnq_meta"))
    if not cursor.fetchone()[0]:
        return None
    cursor.execute("SELECT value FROM cairnq_meta WHERE key = 'schema_version'")
    row = cursor.fetchone()
    return int(row[0]) if row else None


def refuse_other_schema(cursor: Cursor, vendor: str) -> None:
    """Raise if a peer installed a schema version other than the one the models declare."""
    version = installed_schema_version(cursor, vendor)
    if version is None or version == SCHEMA_VERSION:
        return
    if version < SCHEMA_VERSION:
        advice = (
            "Upgrade them first by connecting cairnq>=0.15 (or another peer at schema "
            f"{SCHEMA_VERSION}) once, then run migrate again."
        )
    else:
        advice = (
            "A newer CairnQ implementation migrated them; upgrade cairnq_django to a release "
            f"that speaks schema {version}."
        )
    raise SchemaMismatch(
        f"This database already holds CairnQ tables at schema_version {version}, created by "
        f"another CairnQ implementation; cairnq_django needs {SCHEMA_VERSION}. {advice} "
        "Nothing was changed."
    )


# ------------------------------------------------------------ migration 0001
def create_or_adopt_tables(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Create the tables from the models, or verify a peer's and leave them as they are."""
    connection = schema_editor.connection
    models = [apps.get_model("cairnq_django", name) for name in PROTOCOL_MODELS]
    existing = set(connection.introspection.table_names())
    present = [m._meta.db_table for m in models if m._meta.db_table in existing]
    if not present:
        for model in models:
            schema_editor.create_model(model)
        return
    with connection.cursor() as cursor:
        refuse_other_schema(cursor, connection.vendor)
    problems = [f"table {m._meta.db_table} is missing" for m in models
                if m._meta.db_table not in existing]
    if not problems:
        problems = _differences(models, connection)
    if problems:
        raise SchemaMismatch(
            "This database holds CairnQ tables that differ from schema "
            f"{SCHEMA_VERSION}: {'; '.join(problems)}. Nothing was changed; restore the "
            "peer's schema (or migrate an empty database) and run migrate again."
        )


def drop_tables(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    for name in reversed(PROTOCOL_MODELS):
        schema_editor.delete_model(apps.get_model("cairnq_django", name))


def _differences(models: Sequence[type[Model]], connection: BaseDatabaseWrapper) -> list[str]:
    """Where the tables in the database differ from the models, read from the catalog."""
    problems = []
    with connection.cursor() as cursor:
        for model in models:
            table = model._meta.db_table
            columns = {
                c.name: c for c in connection.introspection.get_table_description(cursor, table)
            }
            constraints = connection.introspection.get_constraints(cursor, table)
            for field in model._meta.local_fields:
                column = columns.get(field.column)
                if column is None:
                    problems.append(f"{table}.{field.column} is missing")
                elif not field.primary_key and bool(column.null_ok) != field.null:
                    problems.append(f"{table}.{field.column} is {'' if column.null_ok else 'NOT '}NULL")
            for index in model._meta.indexes:
                if index.name not in constraints:
                    problems.append(f"index {index.name} is missing")
            for field in model._meta.local_fields:
                if isinstance(field, RelatedField) and not any(
                    info.get("foreign_key") == (field.related_model._meta.db_table,
                                                field.target_field.column)
                    and info["columns"] == [field.column]
                    for info in constraints.values()
                ):
                    problems.append(f"the foreign key {table}.{field.column} is missing")
    return problems


# ------------------------------------------- migration 0001, after the tables
def install_protocol_objects(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """The notify trigger (PostgreSQL), the meta rows and the peers' ledger."""
    connection = schema_editor.connection
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        if dialect.has_listen_notify:
            cursor.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgname = 'cairnq_tasks_notify'"
                " AND tgrelid = 'cairnq_tasks'::regclass"
            )
            if not cursor.fetchone()[0]:  # a peer's trigger is left as it is
                cursor.execute(NOTIFY_FUNCTION)
                cursor.execute(NOTIFY_TRIGGER)
    ensure_protocol_rows(connection.alias, apps)
    if dialect.needs_periodic_analyze:
        # Without statistics SQLite's planner skips the lease-recovery index.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE cairnq_tasks")


def remove_protocol_objects(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if dialect_for(connection).has_listen_notify:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS cairnq_tasks_notify ON cairnq_tasks")
            cursor.execute("DROP FUNCTION IF EXISTS cairnq_notify()")
    apps.get_model("cairnq_django", "ProtocolMeta").objects.using(connection.alias).delete()
    apps.get_model("cairnq_django", "PeerMigration").objects.using(connection.alias).delete()


def ensure_protocol_rows(using: str, apps: Apps | None = None) -> None:
    """Insert the meta rows and ledger entries that are missing; never change one."""
    from django.apps import apps as installed_apps

    apps = apps or installed_apps
    meta = apps.get_model("cairnq_django", "ProtocolMeta")
    ledger = apps.get_model("cairnq_django", "PeerMigration")
    meta.objects.using(using).bulk_create(
        [meta(key="protocol_version", value=str(PROTOCOL_VERSION)),
         meta(key="schema_version", value=str(SCHEMA_VERSION))],
        ignore_conflicts=True,
    )
    # Stamped by the queue's clock, as the store stamps a task row.
    names = dialect_for(connections[using]).peer_migrations
    ledger.objects.using(using).bulk_create(
        [ledger(name=name, applied_at_ms=NowMs()) for name in names],
        ignore_conflicts=True,
    )


# ------------------------------------------------------------- migration 0008
def set_queue_table_storage(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """The queue table's storage parameters for autovacuum (PostgreSQL; see dialects.py)."""
    storage = dialect_for(schema_editor.connection).queue_table_storage
    if storage and _owns_queue_table(schema_editor):
        settings = ", ".join(f"{name} = {value}" for name, value in storage)
        schema_editor.execute(f"ALTER TABLE cairnq_tasks SET ({settings})")


def reset_queue_table_storage(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    storage = dialect_for(schema_editor.connection).queue_table_storage
    if storage and _owns_queue_table(schema_editor):
        names = ", ".join(name for name, _ in storage)
        schema_editor.execute(f"ALTER TABLE cairnq_tasks RESET ({names})")


def _owns_queue_table(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    """Whether this role may ALTER the queue table: a peer's role may own an adopted one.

    The settings are worth having, never worth a failed migrate; without them
    docs/database-setup.md shows the owner how to set them.
    """
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = 'cairnq_tasks'::regclass"
        )
        return bool(cursor.fetchone()[0])
