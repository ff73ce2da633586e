"""Read the CairnQ objects of a database from its catalog, for schema comparisons.

Each function takes a DB-API cursor on SQLite or PostgreSQL and returns plain,
comparable Python values. Nothing here looks at our own DDL strings: what is
compared is what the database says it holds.
"""

from __future__ import annotations

import re
import uuid
from contextlib import contextmanager

CAIRNQ_TABLES = ("cairnq_migrations", "cairnq_meta", "cairnq_task_keys", "cairnq_tasks")


def _fetch(cursor, sql, params=None):
    cursor.execute(sql, params or ())
    return [tuple(row) for row in cursor.fetchall()]


def _normalize_sql(text: str | None) -> str | None:
    if text is None:
        return None
    text = re.sub(r"\s+", " ", text.strip().lower())
    return re.sub(r"\s*([(),=])\s*", r"\1", text)


def _normalize_predicate(text: str) -> str:
    """A partial index's WHERE as SQLite's planner compares it: parsed, not spelled.

    Django quotes identifiers and wraps the condition in parentheses; SQLite
    matches a query against the predicate's expression tree, where neither
    leaves a trace, so both spellings are folded to the bare form.
    """
    text = _normalize_sql(text).replace('"', "")
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1]
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


# ------------------------------------------------------------------- SQLite
def sqlite_catalog(cursor) -> dict:
    """Tables, columns, foreign keys and indexes of the cairnq_* objects."""
    tables = [
        row[0]
        for row in _fetch(
            cursor,
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'cairnq%'"
            " ORDER BY name",
        )
    ]
    catalog: dict = {"tables": tables, "columns": {}, "foreign_keys": {}, "indexes": {}}
    for table in tables:
        catalog["columns"][table] = [
            # cid, name, type, notnull, default, pk, hidden
            (name, ctype.lower(), bool(notnull), _normalize_sql(default), pk)
            for _cid, name, ctype, notnull, default, pk, _hidden in _fetch(
                cursor, f"PRAGMA table_xinfo({table})"
            )
        ]
        catalog["foreign_keys"][table] = sorted(
            (ref_table, src, dst, on_update.upper(), on_delete.upper())
            for _id, _seq, ref_table, src, dst, on_update, on_delete, _match in _fetch(
                cursor, f"PRAGMA foreign_key_list({table})"
            )
        )
        for _seq, name, unique, origin, partial in _fetch(cursor, f"PRAGMA index_list({table})"):
            keys = [
                (column, "desc" if desc else "asc")
                for _seqno, _cid, column, desc, _coll, key in _fetch(
                    cursor, f"PRAGMA index_xinfo({name})"
                )
                if key
            ]
            predicate = None
            if partial:
                sql = _fetch(cursor, f"SELECT sql FROM sqlite_master WHERE name = '{name}'")[0][0]
                predicate = _normalize_predicate(
                    re.split(r"\bwhere\b", sql, flags=re.I, maxsplit=1)[1]
                )
            # Automatic indexes (the primary keys) get generated names; key them by table.
            label = name if origin == "c" else f"{table}:{origin}"
            catalog["indexes"][label] = {
                "table": table,
                "columns": keys,
                "unique": bool(unique),
                "predicate": predicate,
            }
    return catalog


# --------------------------------------------------------------- PostgreSQL
def postgres_catalog(cursor) -> dict:
    """Tables, columns, constraints, indexes, trigger and function of cairnq_*."""
    tables = [
        row[0]
        for row in _fetch(
            cursor,
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename LIKE 'cairnq%%' ORDER BY tablename",
        )
    ]
    catalog: dict = {"tables": tables, "columns": {}, "constraints": {}, "indexes": {}}
    for table in tables:
        catalog["columns"][table] = _fetch(
            cursor,
            "SELECT column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = %s"
            " ORDER BY ordinal_position",
            [table],
        )
        catalog["constraints"][table] = sorted(
            _fetch(
                cursor,
                "SELECT conname, contype::text, pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = %s::regclass",
                [table],
            )
        )
    for name, table, unique, primary, definition, predicate, options in _fetch(
        cursor,
        "SELECT ic.relname, tc.relname, ix.indisunique, ix.indisprimary,"
        " pg_get_indexdef(ix.indexrelid), pg_get_expr(ix.indpred, ix.indrelid),"
        " ix.indoption::text"
        " FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid"
        " JOIN pg_class tc ON tc.oid = ix.indrelid"
        " JOIN pg_namespace n ON n.oid = tc.relnamespace"
        " WHERE n.nspname = current_schema() AND tc.relname LIKE 'cairnq%%'",
    ):
        catalog["indexes"][name] = {
            "table": table,
            "unique": unique,
            "primary": primary,
            "definition": definition,
            "predicate": predicate,
            "options": options,
        }
    catalog["triggers"] = _fetch(
        cursor,
        "SELECT t.tgname, pg_get_triggerdef(t.oid) FROM pg_trigger t"
        " JOIN pg_class c ON c.oid = t.tgrelid"
        " WHERE c.relname LIKE 'cairnq%%' AND NOT t.tgisinternal ORDER BY t.tgname",
    )
    catalog["functions"] = _fetch(
        cursor,
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid),"
        " p.prorettype::regtype::text, l.lanname, p.provolatile::text"
        " FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = current_schema() AND p.proname LIKE 'cairnq%%' ORDER BY 1",
    )
    return catalog


# Tables cairnq_django keeps for itself (Django-managed models such as the
# schedules' state): not part of the protocol, so no peer creates them.
DJANGO_OWNED_PREFIX = "cairnq_django_"


def catalog(cursor, vendor: str) -> dict:
    found = sqlite_catalog(cursor) if vendor == "sqlite" else postgres_catalog(cursor)
    return _protocol_only(found)


def _protocol_only(found: dict) -> dict:
    """The catalog without the tables (and their indexes) only cairnq_django creates."""
    ours = {t for t in found["tables"] if t.startswith(DJANGO_OWNED_PREFIX)}
    found["tables"] = [t for t in found["tables"] if t not in ours]
    for part in ("columns", "foreign_keys", "constraints"):
        if part in found:
            found[part] = {t: v for t, v in found[part].items() if t not in ours}
    found["indexes"] = {n: i for n, i in found["indexes"].items() if i["table"] not in ours}
    return found


def meta_rows(cursor) -> list[tuple]:
    return _fetch(cursor, "SELECT key, value FROM cairnq_meta ORDER BY key")


def ledger(cursor) -> list[tuple]:
    return _fetch(cursor, "SELECT name, applied_at_ms FROM cairnq_migrations ORDER BY name")


# -------------------------------------------------- scratch Postgres databases
def pg_conninfo(dbname: str) -> dict:
    """psycopg connection keywords for a database on the test server."""
    from django.db import connections

    settings = connections["default"].settings_dict
    info = {"dbname": dbname, "user": settings["USER"], "host": settings["HOST"]}
    if settings.get("PORT"):
        info["port"] = settings["PORT"]
    return info


def pg_dsn(dbname: str) -> str:
    info = pg_conninfo(dbname)
    return f"postgresql://{info['user']}@{info['host']}:{info.get('port', 5432)}/{dbname}"


@contextmanager
def scratch_postgres_database(prefix: str):
    """Create an empty, uniquely named Postgres database and drop it afterwards."""
    import os

    import psycopg

    base = os.environ.get("CAIRNQ_PG_TEST_NAME", "test_cairnq_django")
    name = f"{base}_{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(**pg_conninfo("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(**pg_conninfo("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
