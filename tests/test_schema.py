"""The schema Django migrates is the schema `cairnq==0.15.1` creates.

Each test builds one database with the reference peer (which runs its own
migrations on a fresh database) and compares it, object by object through the
catalog, with the test database Django migrated.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest
from django.db import connection

from cairnq_django.schema import SCHEMA_VERSION, UPSTREAM_MIGRATIONS

from . import catalog

pytestmark = pytest.mark.django_db

VENDOR = connection.vendor


def _open_peer(target: str) -> None:
    """Connect the reference SDK once so it migrates `target`, then close it."""
    from cairnq import CairnQ

    async def run():
        client = CairnQ.sqlite(target) if VENDOR == "sqlite" else CairnQ.postgres(target)
        await client.connect()
        await client.close()

    asyncio.run(run())


@pytest.fixture
def peer_db(tmp_path):
    """A DB-API connection to a fresh database the reference peer set up."""
    if VENDOR == "sqlite":
        path = str(tmp_path / "peer.sqlite3")
        _open_peer(path)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
    else:
        import psycopg

        with catalog.scratch_postgres_database("peer") as name:
            _open_peer(catalog.pg_dsn(name))
            conn = psycopg.connect(**catalog.pg_conninfo(name), autocommit=True)
            try:
                yield conn
            finally:
                conn.close()


@pytest.fixture
def ours():
    with connection.cursor() as cursor:
        yield cursor


def test_same_tables(ours, peer_db):
    peer = catalog.catalog(peer_db.cursor(), VENDOR)
    mine = catalog.catalog(ours, VENDOR)
    assert mine["tables"] == peer["tables"] == sorted(catalog.CAIRNQ_TABLES)


# The one difference the catalogs may show, each case named: on SQLite Django
# declares every primary key NOT NULL, where the peers' `text PRIMARY KEY`
# would (by an SQLite quirk) take a NULL. Same type, same affinity, stricter.
SQLITE_PRIMARY_KEYS = {
    "cairnq_migrations": "name", "cairnq_meta": "key", "cairnq_task_keys": "key",
    "cairnq_tasks": "id",
}


def _as_the_peer_declares(table: str, columns: list) -> list:
    if VENDOR != "sqlite":
        return columns
    pk = SQLITE_PRIMARY_KEYS[table]
    return [(n, t, False if n == pk else nn, d, p) for n, t, nn, d, p in columns]


def test_same_columns(ours, peer_db):
    peer = catalog.catalog(peer_db.cursor(), VENDOR)
    mine = catalog.catalog(ours, VENDOR)
    for table in catalog.CAIRNQ_TABLES:
        assert _as_the_peer_declares(table, mine["columns"][table]) == peer["columns"][table], table
        if VENDOR == "sqlite":
            pk = SQLITE_PRIMARY_KEYS[table]
            assert [nn for n, _t, nn, _d, _p in mine["columns"][table] if n == pk] == [True]
    # A sanity anchor, so two equally wrong catalogs cannot pass together.
    columns = {row[0]: row for row in mine["columns"]["cairnq_tasks"]}
    assert len(columns) == 23
    if VENDOR == "postgresql":
        assert columns["payload"][1] == "jsonb"
        assert columns["lease_until_ms"][1] == "bigint"
        assert columns["metadata"][3] == "'{}'::jsonb"
    else:
        assert columns["payload"][1:3] == ("text", True)
        assert columns["id"][4] == 1  # primary key


def test_same_foreign_keys_and_constraints(ours, peer_db):
    peer = catalog.catalog(peer_db.cursor(), VENDOR)
    mine = catalog.catalog(ours, VENDOR)
    if VENDOR == "sqlite":
        assert mine["foreign_keys"] == peer["foreign_keys"]
        assert mine["foreign_keys"]["cairnq_task_keys"] == [
            ("cairnq_tasks", "task_id", "id", "NO ACTION", "CASCADE")
        ]
    else:
        assert mine["constraints"] == peer["constraints"]
        definitions = {row[2] for row in mine["constraints"]["cairnq_task_keys"]}
        assert "FOREIGN KEY (task_id) REFERENCES cairnq_tasks(id) ON DELETE CASCADE" in definitions
        checks = [row for row in mine["constraints"]["cairnq_tasks"] if row[1] == "c"]
        assert len(checks) == 1 and "status" in checks[0][2]


def test_same_indexes(ours, peer_db):
    peer = catalog.catalog(peer_db.cursor(), VENDOR)
    mine = catalog.catalog(ours, VENDOR)
    assert mine["indexes"] == peer["indexes"]
    names = set(mine["indexes"])
    assert "cairnq_tasks_status_idx" not in names  # dropped at schema 10
    for expected in (
        "cairnq_tasks_claim_idx",
        "cairnq_tasks_claim_name_idx",
        "cairnq_tasks_name_idx",
        "cairnq_tasks_root_idx",
        "cairnq_tasks_correlation_idx",
        "cairnq_tasks_completed_idx",
        "cairnq_tasks_status_completed_idx",
        "cairnq_tasks_lease_idx",
        "cairnq_tasks_queue_completed_idx",
    ):
        assert expected in names
    lease = mine["indexes"]["cairnq_tasks_lease_idx"]
    assert lease["predicate"] is not None and "running" in lease["predicate"]
    if VENDOR == "sqlite":
        assert mine["indexes"]["cairnq_tasks_claim_idx"]["columns"] == [
            ("queue", "asc"), ("status", "asc"), ("priority", "desc"),
            ("run_at_ms", "asc"), ("id", "asc"),
        ]


@pytest.mark.skipif(VENDOR != "postgresql", reason="the notify trigger is Postgres-only")
def test_same_trigger_and_function(ours, peer_db):
    peer = catalog.catalog(peer_db.cursor(), VENDOR)
    mine = catalog.catalog(ours, VENDOR)
    assert mine["triggers"] == peer["triggers"]
    assert len(mine["triggers"]) == 1
    assert mine["functions"] == peer["functions"] == [
        ("cairnq_notify", "", "trigger", "plpgsql", "v")
    ]


def test_same_meta_rows_and_ledger_names(ours, peer_db):
    peer_cursor = peer_db.cursor()
    assert catalog.meta_rows(ours) == catalog.meta_rows(peer_cursor) == [
        ("protocol_version", "1"),
        ("schema_version", str(SCHEMA_VERSION)),
    ]
    mine = [name for name, _ in catalog.ledger(ours)]
    theirs = [name for name, _ in catalog.ledger(peer_cursor)]
    assert mine == theirs == sorted(UPSTREAM_MIGRATIONS[VENDOR])


_TASK_COLUMNS = (
    "id, name, queue, status, payload, metadata, run_at_ms, created_at_ms, updated_at_ms"
)


def _insert_task(cursor, params: dict, placeholder: str) -> None:
    values = {
        "id": "task_x", "name": "n", "queue": "q", "status": "queued",
        "payload": "{}", "metadata": "{}",
    } | params
    marks = ", ".join([placeholder] * 6)
    cursor.execute(
        f"INSERT INTO cairnq_tasks ({_TASK_COLUMNS}) VALUES ({marks}, 1, 1, 1)",
        [values[k] for k in ("id", "name", "queue", "status", "payload", "metadata")],
    )


BAD_ROWS = [
    pytest.param({"status": "paused"}, id="unknown-status"),
    pytest.param({"payload": "{not json"}, id="payload"),
    pytest.param({"metadata": "[1,"}, id="metadata"),
]


def _integrity_errors():
    import django.db

    errors = [sqlite3.IntegrityError, django.db.IntegrityError, django.db.DataError]
    try:
        import psycopg

        errors += [psycopg.errors.IntegrityError, psycopg.errors.DataError]
    except ImportError:
        pass
    return tuple(errors)


@pytest.mark.parametrize("bad", BAD_ROWS)
def test_checks_reject_the_same_rows(ours, peer_db, bad):
    """Status and JSON validity are enforced by both databases alike."""
    peer_cursor = peer_db.cursor()
    for cursor, mark in ((ours, "%s"), (peer_cursor, "?" if VENDOR == "sqlite" else "%s")):
        with pytest.raises(_integrity_errors()):
            if cursor is ours:
                from django.db import transaction

                with transaction.atomic():
                    _insert_task(cursor, bad, mark)
            else:
                _insert_task(cursor, bad, mark)
    # And a valid row goes in on both, so the rejections are about the value.
    from django.db import transaction

    with transaction.atomic():
        _insert_task(ours, {}, "%s")
    _insert_task(peer_cursor, {}, "?" if VENDOR == "sqlite" else "%s")


@pytest.mark.skipif(VENDOR != "sqlite", reason="SQLite keeps JSON as checked text")
@pytest.mark.parametrize("column", ["result", "error"])
def test_sqlite_checks_nullable_json_columns(ours, peer_db, column):
    from django.db import transaction

    for cursor, mark in ((ours, "%s"), (peer_db.cursor(), "?")):
        with pytest.raises(_integrity_errors()):
            if cursor is ours:
                with transaction.atomic():
                    _insert_task(cursor, {}, mark)
                    cursor.execute(
                        f"UPDATE cairnq_tasks SET {column} = {mark} WHERE id = 'task_x'", ["{x"]
                    )
            else:
                cursor.execute("BEGIN")
                try:
                    _insert_task(cursor, {}, mark)
                    cursor.execute(
                        f"UPDATE cairnq_tasks SET {column} = {mark} WHERE id = 'task_x'", ["{x"]
                    )
                finally:
                    cursor.execute("ROLLBACK")


@pytest.mark.skipif(VENDOR != "postgresql", reason="the notify trigger is Postgres-only")
def test_trigger_notifies_alike(transactional_db, peer_db):
    """Inserting, claiming and finishing a task notifies the same channels on both."""
    import psycopg

    def notifications(dbname: str) -> list[tuple[str, str]]:
        info = catalog.pg_conninfo(dbname)
        with psycopg.connect(**info, autocommit=True) as listener, psycopg.connect(
            **info, autocommit=True
        ) as writer:
            listener.execute("LISTEN cairnq_queued")
            listener.execute("LISTEN cairnq_done")
            _insert_task(writer.cursor(), {"id": "task_n", "queue": "mail"}, "%s")
            for status in ("running", "queued", "running", "succeeded"):
                writer.execute("UPDATE cairnq_tasks SET status = %s WHERE id = 'task_n'", [status])
            writer.execute("UPDATE cairnq_tasks SET progress = 1 WHERE id = 'task_n'")
            writer.execute("DELETE FROM cairnq_tasks WHERE id = 'task_n'")
            got = [
                (n.channel, n.payload)
                for n in listener.notifies(timeout=2.0, stop_after=3)
            ]
        return got

    expected = [
        ("cairnq_queued", "mail"),
        ("cairnq_queued", "mail"),
        ("cairnq_done", "task_n"),
    ]
    assert notifications(connection.settings_dict["NAME"]) == expected
    assert notifications(peer_db.info.dbname) == expected


def _database_of(conn) -> dict:
    """DATABASES settings for the database a DB-API connection is open on."""
    settings = {k: v for k, v in connection.settings_dict.items()
                if k in ("ENGINE", "USER", "HOST", "PORT", "OPTIONS")}
    if VENDOR == "sqlite":
        settings["NAME"] = conn.execute("PRAGMA database_list").fetchone()[2]
    else:
        settings["NAME"] = conn.info.dbname
    return settings


def _migrate(conn, tmp_path, *args: str, expect_ok: bool = True):
    """Run our real `manage.py migrate` against the database `conn` is open on."""
    return _manage(tmp_path, _database_of(conn), "migrate", *args, "--no-input",
                   expect_ok=expect_ok)


def test_our_migration_changes_nothing_on_a_peer_database(peer_db, tmp_path):
    """`migrate` over a database the peer set up verifies it and changes nothing."""
    before = catalog.catalog(peer_db.cursor(), VENDOR)
    ledger_before = catalog.ledger(peer_db.cursor())
    meta_before = catalog.meta_rows(peer_db.cursor())
    out = _migrate(peer_db, tmp_path)
    assert "cairnq_django.0001_initial... OK" in out
    assert catalog.catalog(peer_db.cursor(), VENDOR) == before
    assert catalog.ledger(peer_db.cursor()) == ledger_before
    assert catalog.meta_rows(peer_db.cursor()) == meta_before


def test_a_peer_database_that_differs_from_the_models_is_refused_unchanged(peer_db, tmp_path):
    cursor = peer_db.cursor()
    cursor.execute("DROP INDEX cairnq_tasks_lease_idx")
    before = catalog.catalog(cursor, VENDOR)
    out = _migrate(peer_db, tmp_path, expect_ok=False)
    assert "index cairnq_tasks_lease_idx is missing" in out and "Nothing was changed" in out
    assert catalog.catalog(peer_db.cursor(), VENDOR) == before


def test_json_columns_round_trip_through_the_peer_schema(ours):
    """A task written through Django's connection stores real JSON, not repr text."""
    from cairnq_django.store import get_store

    task = get_store().submit("schema.json", {"a": [1, 2.5, None, "x"]})
    if VENDOR == "postgresql":
        ours.execute("SELECT payload::text, jsonb_typeof(payload) FROM cairnq_tasks WHERE id = %s", [task.id])
        text, kind = ours.fetchone()
        assert kind == "object"
    else:
        ours.execute("SELECT payload, json_type(payload) FROM cairnq_tasks WHERE id = %s", [task.id])
        text, kind = ours.fetchone()
        assert kind == "object"
    assert json.loads(text) == {"a": [1, 2.5, None, "x"]}


@pytest.mark.parametrize("version", ["7", "11"])
def test_another_schema_version_is_refused_with_what_to_do(peer_db, tmp_path, version):
    cursor = peer_db.cursor()
    cursor.execute("UPDATE cairnq_meta SET value = %s WHERE key = 'schema_version'"
                   .replace("%s", "?" if VENDOR == "sqlite" else "%s"), [version])
    before = catalog.catalog(cursor, VENDOR)
    out = _migrate(peer_db, tmp_path, expect_ok=False)
    assert f"schema_version {version}" in out and "Nothing was changed" in out
    assert ("cairnq>=0.15" if version == "7" else "upgrade cairnq_django") in out
    assert catalog.catalog(peer_db.cursor(), VENDOR) == before
    assert dict(catalog.meta_rows(peer_db.cursor()))["schema_version"] == version


def test_a_fresh_database_has_no_installed_schema(tmp_path):
    from cairnq_django.schema import installed_schema_version

    if VENDOR == "sqlite":
        conn = sqlite3.connect(str(tmp_path / "empty.sqlite3"))
        assert installed_schema_version(conn.cursor(), VENDOR) is None
        conn.close()
    else:
        import psycopg

        with catalog.scratch_postgres_database("empty") as name:
            with psycopg.connect(**catalog.pg_conninfo(name)) as conn:
                assert installed_schema_version(conn.cursor(), VENDOR) is None


def _manage(tmp_path, database: dict, *args: str, expect_ok: bool = True):
    """Run `django-admin <args>` in a child process against `database`."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "migrate_settings.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa
            DATABASES = {{"default": {database!r}}}
            """
        )
    )
    env = dict(
        os.environ, PYTHONPATH=f"{tmp_path}:{root}", DJANGO_SETTINGS_MODULE="migrate_settings"
    )
    env.pop("CAIRNQ_CHILD_DB_NAME", None)
    proc = subprocess.run(
        [sys.executable, "-m", "django", *args], cwd=root, env=env,
        capture_output=True, text=True, timeout=300,
    )
    if not expect_ok:
        assert proc.returncode != 0, proc.stdout[-2000:]
        return proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_migrate_forwards_and_backwards_on_a_fresh_database(tmp_path):
    """`manage.py migrate` builds the schema; migrating cairnq_django to zero removes it all."""
    import contextlib

    def tables():
        if VENDOR == "sqlite":
            conn = sqlite3.connect(database["NAME"])
            try:
                return catalog.sqlite_catalog(conn.cursor())["tables"], conn.execute(
                    "SELECT count(*) FROM sqlite_master WHERE name LIKE 'cairnq%'"
                ).fetchone()[0]
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(**catalog.pg_conninfo(database["NAME"])) as conn:
            cursor = conn.cursor()
            functions = catalog.postgres_catalog(cursor)["functions"]
            return catalog.postgres_catalog(cursor)["tables"], len(functions)

    def protocol(names):
        # Django-owned tables (the schedules' state, ...) come and go with the app too.
        return [n for n in names if not n.startswith(catalog.DJANGO_OWNED_PREFIX)]

    with contextlib.ExitStack() as stack:
        database = dict(connection.settings_dict)
        database = {k: database[k] for k in ("ENGINE", "NAME", "USER", "HOST", "PORT", "OPTIONS")
                    if k in database}
        if VENDOR == "sqlite":
            database["NAME"] = str(tmp_path / "migrated.sqlite3")
        else:
            database["NAME"] = stack.enter_context(catalog.scratch_postgres_database("mig"))
        _manage(tmp_path, database, "migrate", "--no-input")
        names, objects = tables()
        assert protocol(names) == sorted(catalog.CAIRNQ_TABLES) and objects > 0
        _manage(tmp_path, database, "migrate", "cairnq_django", "zero", "--no-input")
        assert tables() == ([], 0)
        _manage(tmp_path, database, "migrate", "cairnq_django", "--no-input")
        assert protocol(tables()[0]) == sorted(catalog.CAIRNQ_TABLES)


def test_makemigrations_finds_nothing_to_write():
    """The migrations are what makemigrations writes from the models, on this Django."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("makemigrations", "cairnq_django", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_postgres_adds_no_index_the_protocol_lacks(ours):
    """No `_like` pattern-ops index beside a text primary key, no index on the foreign key."""
    indexes = set(catalog.catalog(ours, VENDOR)["indexes"])
    assert not {name for name in indexes if name.endswith("_like")}
    assert not {name for name in indexes if "task_id" in name}
