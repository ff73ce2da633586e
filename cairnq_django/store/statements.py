"""ORM-built statements, compiled once per database and shape, run on Django's cursor.

A statement is a QuerySet (a select, an `update()`, a delete, an insert)
compiled by Django's own compiler for the alias. Its `Param`s and the SQLite
clock compile to slots, so the SQL text is built once and each run only binds
values: compiling a claim with its CASE expressions costs more than running
it. Django's `update()` returns a count, not rows, and the protocol's
transitions must return the rows they changed (an ownership check that
matched nothing is a lost lease), so updates and deletes get a RETURNING
list of the task's columns.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, cast

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.sql import DeleteQuery, InsertQuery, UpdateQuery

from ..db.dialects import dialect_of
from ..db.expressions import NOW_SLOT, Slot, compiling_template
from ..ids import now_ms
from ..records import COLUMNS

Template = tuple[str, tuple[Any, ...]]


def select_sql(queryset: QuerySet) -> Template:
    return queryset.query.get_compiler(queryset.db).as_sql()


def update_sql(queryset: QuerySet, values: dict[str, Any], returning: str) -> Template:
    """`queryset.update(**values)` as SQL, returning the rows it changed."""
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))  # chain(klass) returns a klass
    query.add_update_values(values)
    query.annotations = {}
    sql, params = query.get_compiler(queryset.db).as_sql()
    return f"{sql} RETURNING {returning}", params


def delete_sql(queryset: QuerySet, returning: str) -> Template:
    """A bulk delete of `queryset` (no collector: the database cascades), returning columns."""
    query = queryset.query.clone()
    query.__class__ = DeleteQuery
    sql, params = query.get_compiler(queryset.db).as_sql()
    return f"{sql} RETURNING {returning}", params


def insert_sql(model, fields: Sequence[str], rows: list[Model], using: str, *,
               returning: Sequence[str] = (), on_conflict=None, update_fields=(),
               unique_fields=()) -> Template:
    """A multi-row INSERT of unsaved model instances whose values may be expressions."""
    meta = model._meta
    query = InsertQuery(
        model,
        on_conflict=on_conflict,
        update_fields=[meta.get_field(f) for f in update_fields] or None,
        unique_fields=[meta.get_field(f) for f in unique_fields] or None,
    )
    query.insert_values([meta.get_field(f) for f in fields], rows)
    compiler = query.get_compiler(using)
    compiler.returning_fields = [meta.get_field(f) for f in returning] or None
    ((sql, params),) = compiler.as_sql()
    return sql, tuple(params)


def returning_columns(using: str) -> str:
    """The select list of a whole task row, free-text columns raw where the dialect needs it."""
    dialect = dialect_of(using)
    quote = connections[using].ops.quote_name
    return ", ".join(
        f"CAST({quote(c)} AS BLOB) AS {quote(c)}" if dialect.reads_raw(c) else quote(c)
        for c in COLUMNS
    )


# Django's SQLite cursor turns positional placeholders into "?" with a regex
# over the whole statement on every run, and named ones with one % format;
# SQLite finds a named parameter by a linear scan, so only short lists go by name.
_PLACEHOLDER = re.compile(r"(?<!%)%s")
_MAX_NAMED = 64
_NAMES = tuple(f"p{i}" for i in range(_MAX_NAMED))


def _named(sql: str) -> str:
    counter = iter(_NAMES)
    return _PLACEHOLDER.sub(lambda _: f"%({next(counter)})s", sql)


def qmark(sql: str) -> str:
    """Django's `%s` placeholders as a plain sqlite3 connection takes them (`?`)."""
    return _PLACEHOLDER.sub("?", sql).replace("%%", "%")


class Statement:
    """One statement of the store, built by `build(using, *shape)` and cached per (alias, shape)."""

    def __init__(self, build: Callable[..., Template]) -> None:
        self._build = build
        self._cache: dict[Hashable, Template] = {}
        self._lock = threading.Lock()

    def compiled(self, using: str, shape: tuple = ()) -> bool:
        return (using, shape) in self._cache

    def template(self, using: str, shape: tuple = ()) -> Template:
        key = (using, shape)
        hit = self._cache.get(key)
        if hit is None:
            token = compiling_template.set(True)
            try:
                sql, params = self._build(using, *shape)
            finally:
                compiling_template.reset(token)
            if dialect_of(using).binds_by_name and len(params) <= _MAX_NAMED:
                sql = _named(sql)
            with self._lock:
                if len(self._cache) > 256:  # shapes are few; a bound all the same
                    self._cache.clear()
                hit = self._cache[key] = (sql, tuple(params))
        return hit

    def bind(self, using: str, values: Mapping[str, Any], shape: tuple = (),
             rows: Sequence[Mapping[str, Any]] = (), now: int | None = None) -> tuple[str, Any]:
        sql, template = self.template(using, shape)
        params = []
        for param in template:
            if param is NOW_SLOT:
                if now is None:
                    now = now_ms()
                params.append(now)
            elif isinstance(param, Slot):
                params.append(values[param.name] if param.row is None else rows[param.row][param.name])
            else:
                params.append(param)
        if "%(p0)s" in sql:
            return sql, dict(zip(_NAMES, params, strict=False))  # _NAMES is the longest there is
        return sql, params
