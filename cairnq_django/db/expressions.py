"""The Django expressions the queue's statements are written with.

`NowMs` is "now in epoch milliseconds", compiled per backend: the database
clock on PostgreSQL (hosts do not share a clock), the process clock on SQLite.
`Param` is a value bound when a cached statement runs (see statement_cache.py).
`LiteralIn` spells a status list as literals, because SQLite uses a partial
index only when it can prove the query's WHERE implies the index predicate,
and it cannot with bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Lookup
from django.db.models.expressions import CombinedExpression, Expression
from django.db.models.sql.compiler import SQLCompiler

from ..ids import now_ms
from .dialects import RAW_TEXT_COLUMNS
from .fields import EpochMillisField

# What as_sql() and its vendor variants return here: SQL and a list of
# parameters that may be Slots. django-stubs 6 declares a tuple of str | int
# (Django 6's own expressions build tuples); Django's compilers, 5.2 to 6.1,
# take any sequence of adaptable values.
SqlAndParams = tuple[str, Any]

# True while statement_cache.py compiles a statement to cache it (set only by
# store/django_private.compile_statement): Params and the SQLite clock then
# become slots, filled in each time the statement runs.
compiling_template: ContextVar[bool] = ContextVar("cairnq_compiling_template", default=False)


class Slot:
    """A placeholder's value, named, in a cached statement's parameter list."""

    __slots__ = ("name", "row")

    def __init__(self, name: str, row: int | None = None) -> None:
        self.name = name
        self.row = row

    def __repr__(self) -> str:
        return f"Slot({self.name!r}, row={self.row!r})"


NOW_SLOT = Slot("now_ms")


class Param(Expression):
    """A named value supplied when the statement runs (`row` for multi-row inserts)."""

    def __init__(self, name: str, output_field: models.Field, row: int | None = None) -> None:
        super().__init__(output_field=output_field)
        self.slot = Slot(name, row)

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> SqlAndParams:
        if not compiling_template.get():
            raise RuntimeError(f"Param {self.slot.name!r} outside a cached statement.")
        return "%s", [self.slot]

    def __repr__(self) -> str:
        return f"Param({self.slot.name!r})"


class JsonParam(Param):
    """Already-encoded JSON text (the codec's own, never re-encoded by Django)."""

    def __init__(self, name: str, row: int | None = None) -> None:
        super().__init__(name, models.JSONField(null=True), row)

    def as_postgresql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> SqlAndParams:
        sql, params = self.as_sql(compiler, connection)
        return f"{sql}::jsonb", params


def text_param(name: str, row: int | None = None) -> Param:
    return Param(name, models.TextField(), row)


def int_param(name: str, row: int | None = None) -> Param:
    # Typed as the epoch columns, so "now + lease_ms" needs no output_field.
    return Param(name, EpochMillisField(), row)


def float_param(name: str) -> Param:
    return Param(name, models.FloatField())


def bool_param(name: str) -> Param:
    return Param(name, models.BooleanField())


class NowMs(Expression):
    """Now in epoch ms: one value for the whole statement, from the queue's clock."""

    output_field = EpochMillisField()

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> SqlAndParams:
        # SQLite: the process clock, bound like any other value.
        return "%s", [NOW_SLOT if compiling_template.get() else now_ms()]

    def as_postgresql(self, compiler: SQLCompiler | None, connection: BaseDatabaseWrapper) -> SqlAndParams:
        # statement_timestamp() is the database clock and stable within a
        # statement, so every use in one statement (a row's created_at and
        # updated_at, a claim's bound and its new lease) reads the same value
        # and the planner can use it as an index bound.
        return "(extract(epoch from statement_timestamp()) * 1000)::bigint", []


def now_plus(ms: Any, sign: str = "+") -> CombinedExpression:
    """Now + ms (a Param, an expression or an int), typed as an epoch column."""
    ms = ms if hasattr(ms, "resolve_expression") else models.Value(ms)
    return CombinedExpression(NowMs(), sign, ms, output_field=EpochMillisField())


def now_minus(ms: Any) -> CombinedExpression:
    return now_plus(ms, "-")


class LiteralIn(Lookup):
    """`column IN ('a', 'b')` with the values inlined (code constants only, never input).

    A Lookup, not a plain expression: Django puts a lookup into WHERE as it is,
    while on SQLite (no boolean type) Django 6 compares any other conditional
    expression with true, which no partial index predicate matches.
    """

    lookup_name = "literal_in"
    prepare_rhs = False

    def __init__(self, column: str, values: Sequence[str]) -> None:
        for value in values:
            if not value.isidentifier():
                raise ValueError(f"LiteralIn takes identifiers only, not {value!r}.")
        super().__init__(models.F(column), tuple(values))

    def as_sql(self, compiler: SQLCompiler, connection: BaseDatabaseWrapper) -> SqlAndParams:
        column, params = self.process_lhs(compiler, connection)
        if len(self.rhs) == 1:
            # "=": SQLite proves a partial index's `status = 'running'` from
            # an equal term, not from a one-element IN.
            return f"{column} = '{self.rhs[0]}'", list(params)
        literals = ", ".join(f"'{value}'" for value in self.rhs)
        return f"{column} IN ({literals})", list(params)


class RawText(Expression):
    """A free-text column as the codec reads it: bytes on SQLite, text elsewhere.

    The one way the package reads payload, result, error, metadata and message
    (dialects.RAW_TEXT_COLUMNS): Python's sqlite3 decodes TEXT while fetching,
    and one value that is not UTF-8 fails the whole statement (a claim, a
    listing), while a BLOB comes back as bytes for the codec to decode and
    report. PostgreSQL text is always valid, and Django's drivers hand jsonb
    over as its text.
    """

    def __init__(self, column: str) -> None:
        super().__init__(output_field=models.TextField())
        self.column = models.F(column)

    @classmethod
    def for_column(cls, column: str) -> Expression | models.F:
        """`column` read as the codec reads it: raw if it is free text, else as it is."""
        return cls(column) if column in RAW_TEXT_COLUMNS else models.F(column)

    def get_source_expressions(self) -> list[Any]:
        return [self.column]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.column,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> SqlAndParams:
        sql, params = compiler.compile(self.column)
        return sql, params

    def as_sqlite(self, compiler: Any, connection: Any) -> SqlAndParams:
        sql, params = compiler.compile(self.column)
        return f"CAST({sql} AS BLOB)", params
