"""Every use of Django's private query API in the package, and why each one stays.

Checked on Django 5.2 and 6.1 (tox cells py311-dj52-* and py312-dj61-*). A
Django upgrade that breaks the store breaks it here; everything else builds
QuerySets and hands them to these functions. Timings are SQLite's, on the
test settings, min of 3 timeit runs (the numbers that keep each seam).

1. `query.get_compiler(using).as_sql()`: the SQL of a QuerySet without running
   it, so a statement is compiled once and bound per run (statement_cache.py).
   Compiling a claim costs 1.8 ms; binding and running the compiled one 0.07 ms.
2. `query.chain(UpdateQuery)` + `add_update_values()`: what `QuerySet.update()`
   builds, kept as SQL with a RETURNING list. `update()` returns a count, and
   a transition must return the rows it changed: an ownership check that
   matched nothing is a lost lease, and a second SELECT would race the next
   writer.
3. `query.__class__ = DeleteQuery`: `QuerySet._raw_delete()`'s query (no
   collector: the database cascades), with the RETURNING `delete()` lacks.
4. `InsertQuery` + `compiler.returning_fields`: one row of the INSERT with
   bound parameters and the clock returned, cut at " VALUES " / " RETURNING "
   and repeated per row. Compiling 1,000 model instances costs 91 ms, paid
   again by every new process; repeating one compiled row costs 4.6 ms.
   The key's upsert is the INSERT ... ON CONFLICT DO UPDATE of
   `bulk_create(update_conflicts=True, ...)`, compiled once: through
   `bulk_create()` it cost 140 us a call instead of 22 us, and a keyed
   enqueue 480-590 us instead of 355-370 us.
5. The `%s` placeholder regex Django's SQLite cursor applies to every
   statement, mirrored here to name the parameters of short statements
   (SQLite binds a named list faster) and to give a plain sqlite3 connection
   its `?`.
6. Compiling a statement to cache it (statement_cache.py): inside `atomic()`
   for `select_for_update()`, which Django refuses to compile in autocommit
   mode though the statement only runs later, in a transaction of its own;
   and with db/expressions.py's `compiling_template` set, so that `Param` and
   the SQLite clock compile to `Slot` objects. Django's compilers (5.2 to
   6.1) carry an expression's parameters through to the statement's list
   untouched, never adapting them before execute; the Slots rely on that.
   The flag is ours (a ContextVar, as Django's own expressions receive only
   the compiler and the connection); it is set here only.
7. The driver's cursor behind Django's wrapper (`cursor.cursor`): psycopg 3's
   COPY, which Django has no API for (store/sql.py: half the cost per row of
   a multi-row INSERT); telling a client-side-binding cursor, the only kind
   that sends several statements in one round trip, and walking their result
   sets (`nextset()`, a DB-API extension Django's wrapper passes through);
   and psycopg's `pgresult`, whose field count says whether a statement
   returned rows without building `description` (23 Column objects per task
   row, on every claim and completion). store/postgres_engine.py is where
   these serve the round-trip variants.
8. `queryset.query.where` and `.is_sliced`, for the admin's paginator: is a
   listing filtered (else the catalog's row estimate stands for its count),
   and did the admin slice it yet. QuerySet has no public answer to either.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from django.db import connections, transaction
from django.db.models import F, Field, Model, QuerySet
from django.db.models.constants import OnConflict
from django.db.models.expressions import Expression
from django.db.models.sql import DeleteQuery, InsertQuery, UpdateQuery

from ..db.expressions import compiling_template

Template = tuple[str, tuple[Any, ...]]

T = TypeVar("T")


# ------------------------------------------------------- 1-4: compiling SQL
def select_sql(queryset: QuerySet[Any, Any]) -> Template:
    sql, params = queryset.query.get_compiler(queryset.db).as_sql()
    return sql, tuple(params)


def _select_list(queryset: QuerySet[Any, Any], columns: Sequence[Expression | F]) -> str:
    """`columns` of the queryset's table compiled as a RETURNING list (no parameters)."""
    query = queryset.query.clone()
    compiler = query.get_compiler(queryset.db)
    compiled = []
    for column in columns:
        sql, params = compiler.compile(column.resolve_expression(query, allow_joins=False))
        if params:
            raise ValueError("A RETURNING column takes no parameters.")
        compiled.append(sql)
    return ", ".join(compiled)


def update_sql(
    queryset: QuerySet[Any, Any], values: dict[str, Any], returning: Sequence[Expression | F]
) -> Template:
    """`queryset.update(**values)` as SQL, returning `returning` of the rows it changed."""
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))  # chain(klass) returns a klass
    query.add_update_values(values)
    query.annotations = {}
    sql, params = query.get_compiler(queryset.db).as_sql()
    return f"{sql} RETURNING {_select_list(queryset, returning)}", tuple(params)


def delete_sql(queryset: QuerySet[Any, Any], returning: Sequence[Expression | F]) -> Template:
    """A bulk delete of `queryset` (no collector: the database cascades), returning columns."""
    query = queryset.query.clone()
    query.__class__ = DeleteQuery
    sql, params = query.get_compiler(queryset.db).as_sql()
    return f"{sql} RETURNING {_select_list(queryset, returning)}", tuple(params)


def insert_rows_sql(
    row: Model,
    fields: Sequence[str],
    using: str,
    count: int,
    per_row: Callable[[Any, int], Any],
    returning: Sequence[str] = (),
) -> Template:
    """`count` rows of the one-row INSERT of `row`, joined as Django's bulk insert joins rows.

    `per_row(param, i)` gives row i's copy of each of the row's parameters.
    """
    meta = row._meta
    query = InsertQuery(type(row))
    query.insert_values([cast("Field[Any, Any]", meta.get_field(f)) for f in fields], [row])
    compiler = query.get_compiler(using)
    compiler.returning_fields = [cast("Field[Any, Any]", meta.get_field(f)) for f in returning] or None
    ((sql, params),) = compiler.as_sql()
    head, _, values = sql.partition(" VALUES ")
    values, found, tail = values.partition(" RETURNING ")
    rows_params = tuple(per_row(param, i) for i in range(count) for param in params)
    return f"{head} VALUES {', '.join([values] * count)}{found}{tail}", rows_params


def upsert_sql(
    row: Model, fields: Sequence[str], using: str, *,
    unique_fields: Sequence[str], update_fields: Sequence[str],
) -> Template:
    """The INSERT ... ON CONFLICT DO UPDATE that `bulk_create(update_conflicts=True)` runs."""
    meta = row._meta
    query = InsertQuery(
        type(row),
        on_conflict=OnConflict.UPDATE,
        update_fields=[cast("Field[Any, Any]", meta.get_field(f)) for f in update_fields],
        unique_fields=[cast("Field[Any, Any]", meta.get_field(f)) for f in unique_fields],
    )
    query.insert_values([cast("Field[Any, Any]", meta.get_field(f)) for f in fields], [row])
    ((sql, params),) = query.get_compiler(using).as_sql()
    return sql, tuple(params)


# ------------------------------------------------------------ 5: placeholders
# Django's SQLite cursor turns positional placeholders into "?" with this regex
# over the whole statement on every run, and named ones with one % format;
# SQLite finds a named parameter by a linear scan, so only short lists go by name.
_PLACEHOLDER = re.compile(r"(?<!%)%s")
MAX_NAMED = 64
_NAMES = tuple(f"p{i}" for i in range(MAX_NAMED))
_FIRST_NAME = f"%({_NAMES[0]})s"


def to_named(sql: str) -> str:
    """`sql` with its `%s` placeholders named p0, p1, ... (at most MAX_NAMED of them)."""
    counter = iter(_NAMES)
    return _PLACEHOLDER.sub(lambda _: f"%({next(counter)})s", sql)


def bind_placeholders(sql: str, params: list[Any]) -> list[Any] | dict[str, Any]:
    """`params` as `sql` takes them: by name if to_named() named its placeholders."""
    if _FIRST_NAME in sql:
        return dict(zip(_NAMES, params, strict=False))  # _NAMES is the longest there is
    return params


def qmark(sql: str) -> str:
    """Django's `%s` placeholders as a plain sqlite3 connection takes them (`?`)."""
    return _PLACEHOLDER.sub("?", sql).replace("%%", "%")


# ------------------------------------------------- 6: compiling a template
def compile_statement(using: str, build: Callable[[], T]) -> T:
    """Run `build` (which compiles SQL) as a template: Params become slots, select_for_update() compiles."""
    connection = connections[using]
    token = compiling_template.set(True)
    try:
        if connection.features.has_select_for_update and connection.get_autocommit():
            with transaction.atomic(using=using):
                return build()
        return build()
    finally:
        compiling_template.reset(token)


# -------------------------------------------------------- 7: driver cursors
def driver_copy(cursor: Any) -> Callable[..., Any] | None:
    """psycopg 3's `copy()` behind a Django cursor; None for other drivers (psycopg2)."""
    return getattr(cursor.cursor, "copy", None)


def is_client_binding(cursor: Any) -> bool:
    """Is the driver's cursor behind a Django cursor psycopg 3's client-side-binding one?

    Looked up in sys.modules rather than imported: a cursor can only be one
    once psycopg is loaded, and importing it here cost a SQLite worker about
    a sixth of its start-up (psycopg and libpq, ~50 ms under -X importtime).
    """
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(cursor.cursor, psycopg.ClientCursor)


def returns_rows(cursor: Any) -> bool:
    """`cursor.description is not None`: whether the statement just run returned a result set.

    psycopg's result answers the common case first; other drivers answer
    through `description`.
    """
    result = getattr(getattr(cursor, "cursor", None), "pgresult", None)
    if result is not None and result.nfields:
        return True
    return cursor.description is not None


def run_batch(
    cursor: Any, text: str, params: Sequence[Any] | dict[str, Any], *, skip: int = 0,
    read: int | None = None,
) -> list[list[tuple[Any, ...]]]:
    """Run `text`, statements joined by "; ", as one query: one round trip; each one's rows.

    The first `skip` statements return no rows (a SET LOCAL) and are passed
    over; of the rest, the first `read` are read (None: all of them), so a
    caller that needs none of the last ones' rows asks no more of the driver.
    Only for a cursor is_client_binding() accepts.
    """
    cursor.execute(text, params)
    for _ in range(skip):
        cursor.nextset()
    results = [cursor.fetchall() if returns_rows(cursor) else []]
    while (read is None or len(results) < read) and cursor.nextset():
        results.append(cursor.fetchall() if returns_rows(cursor) else [])
    return results


# ------------------------------------------------------ 8: reading a query
def is_filtered(queryset: QuerySet[Any, Any]) -> bool:
    """Does the queryset have a WHERE clause?"""
    return bool(queryset.query.where)


def is_sliced(queryset: QuerySet[Any, Any]) -> bool:
    """Has the queryset been sliced (LIMIT/OFFSET)?"""
    return bool(queryset.query.is_sliced)
