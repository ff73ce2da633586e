"""Statements compiled once per database alias and shape, then bound per run.

A statement is a QuerySet (a select, an update, a delete, an insert) compiled
by Django's own compiler for the alias (django_private.py). Its `Param`s and
the SQLite clock compile to slots, so the SQL text is built once and each run
only binds values: compiling a claim with its CASE expressions costs more than
running it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..db.dialects import dialect_of
from ..db.expressions import NOW_SLOT, Slot
from ..ids import now_ms
from .django_private import MAX_NAMED, Template, bind_placeholders, compile_statement, to_named


class Statement:
    """One statement of the store, built by `build(using, *shape)` and cached per (alias, shape)."""

    def __init__(self, build: Callable[..., Template]) -> None:
        self._build = build
        # Shapes are few; a bound all the same.
        self.template = functools.lru_cache(maxsize=256)(self._compile)

    def _compile(self, using: str, shape: tuple[Any, ...] = ()) -> Template:
        sql, params = compile_statement(using, lambda: self._build(using, *shape))
        if dialect_of(using).binds_by_name and len(params) <= MAX_NAMED:
            sql = to_named(sql)
        return sql, tuple(params)

    def bind(self, using: str, values: Mapping[str, Any], shape: tuple[Any, ...] = (),
             rows: Sequence[Mapping[str, Any]] = (),
             now: int | None = None) -> tuple[str, list[Any] | dict[str, Any]]:
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
        return sql, bind_placeholders(sql, params)
