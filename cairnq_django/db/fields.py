"""Model fields that declare the CairnQ protocol's column types exactly.

Django's defaults are close but not the same, and the tables are shared with
peers whose own migrations created them: every difference would be a schema
the peers do not expect, or an index every insert pays for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper

from .dialects import dialect_for


class ProtocolTextField(models.TextField):
    """`text`, without the pattern-ops index Django adds to unique text columns.

    On PostgreSQL Django gives every primary-key, unique or indexed column whose
    type starts with "text" a second `text_pattern_ops` index for LIKE queries.
    The protocol has none and nothing here runs LIKE on these columns, so the
    type is spelled TEXT, which PostgreSQL reads as text and Django's check
    does not match.
    """

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        return dialect_for(connection).text_type or super().db_type(connection)


class EpochMillisField(models.BigIntegerField):
    """Epoch milliseconds: `bigint` on PostgreSQL, `integer` (64-bit) on SQLite, as the peers declare."""

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        return dialect_for(connection).epoch_millis_type or super().db_type(connection)


class CascadingForeignKey(models.ForeignKey):
    """A foreign key whose constraint the database enforces with ON DELETE CASCADE.

    The protocol's `cairnq_task_keys.task_id` references `cairnq_tasks(id)` ON
    DELETE CASCADE, so a purge by any peer, in any language, frees the key.
    Django 5.2 cannot declare a database-level cascade; Django 6.1's DB_CASCADE
    can, but makes the constraint DEFERRABLE under a hashed name, unlike the
    peers'. So the model keeps Django's own constraint off (db_constraint=False)
    and the column declares the protocol's constraint inline, which both
    databases accept in CREATE TABLE and name as the peers' is named.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["db_constraint"] = False
        kwargs.setdefault("db_index", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> tuple[str, str, Sequence[Any], dict[str, Any]]:
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("db_constraint", None)
        return name, path, args, kwargs

    def db_type(self, connection: BaseDatabaseWrapper) -> str | None:
        target = self.target_field
        # Resolved to a model class by the time a column type is asked for
        # (django-stubs 6 types related_model so already).
        related_model = self.related_model
        return (
            f"{target.rel_db_type(connection)} REFERENCES"
            f" {related_model._meta.db_table}({target.column}) ON DELETE CASCADE"
        )

    def get_placeholder(self, value: Any, compiler: Any, connection: BaseDatabaseWrapper) -> str:
        """A plain placeholder; defining one keeps bulk_create off PostgreSQL's UNNEST insert.

        That insert casts each column's values to `db_type()`'s array, which
        here carries the inline REFERENCES clause and is no type.
        """
        return "%s"

    def get_placeholder_sql(
        self, value: Any, compiler: Any, connection: BaseDatabaseWrapper
    ) -> tuple[str, Sequence[Any]]:
        """Django 6.1's spelling of get_placeholder (which 5.2 calls, and 6.1 deprecates alone)."""
        if hasattr(value, "as_sql"):
            sql, params = compiler.compile(value)
            return sql, params
        return "%s", (value,)


class CascadingOneToOneField(CascadingForeignKey, models.OneToOneField):
    """CascadingForeignKey for a table with at most one row per task (the app's own tables).

    A peer that purges a task knows nothing of the app's tables; the
    database-level cascade is what keeps them free of orphans.
    """


class ProtocolIndex(models.Index):
    """An index under its protocol name, which may exceed Django's portable 30 characters.

    Django caps index names for Oracle's sake; SQLite and PostgreSQL (63) take
    the protocol's names, and the peers look indexes up by them.
    """

    max_name_length = 63
