"""Runs the store's statements on one alias's connection, after checking its protocol version."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError, connections, transaction
from django.db.models import QuerySet

from ..db.dialects import Dialect, dialect_of
from ..db.expressions import NowMs
from ..db.querysets import TaskQuerySet
from ..errors import CairnQError, ProtocolVersionMismatch
from ..ids import now_ms
from ..models import ProtocolMeta
from ..records import PROTOCOL_VERSION, TaskRecord
from ..tables import known_missing_tables
from . import sql
from .django_private import is_client_binding, returns_rows, run_batch, select_sql
from .protocol_statements import task_columns, tasks_of
from .statement_cache import Statement
from .timeouts import statement_prefix

_verified_aliases: set[str] = set()
_verify_lock = threading.Lock()


def forget_verified(using: str) -> None:
    """Check the alias's protocol version again on its next statement (tests change it)."""
    _verified_aliases.discard(using)


def unreadable_meta_error(using: str, exc: BaseException) -> Exception:
    """Say why the protocol version could not be read: missing tables only when they are.

    Whether they are is the catalog's answer (tables.py), the same one the
    worker and the health check get. Anything else (a refused connection, a
    settings error such as a pool with a persistent CONN_MAX_AGE, a
    permission) is named as what failed; telling the operator to migrate then
    would send them the wrong way.
    """
    if known_missing_tables(using):
        return CairnQError(
            f"The CairnQ tables are missing from database {using!r}; "
            f"run `manage.py migrate cairnq_django --database {using}`. ({exc})"
        )
    detail = str(exc).strip() or type(exc).__name__
    if isinstance(exc, ImproperlyConfigured):
        # Still ImproperlyConfigured: the worker stops on it instead of retrying.
        return ImproperlyConfigured(
            f"CairnQ could not connect to database {using!r}: its settings are invalid "
            f"({detail}). Check settings.DATABASES[{using!r}]."
        )
    if isinstance(exc, (OperationalError, InterfaceError)):
        what = "connecting to it or running a query failed"
    else:
        what = "reading the cairnq_meta table failed"
    return CairnQError(
        f"CairnQ could not use database {using!r}: {what} "
        f"({type(exc).__name__}: {detail})."
    )


class Executor:
    """Runs compiled statements and SQL text on the connection of one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.dialect: Dialect = dialect_of(using)

    def run(self, statement: Statement, values: dict[str, Any] | None = None,
            shape: tuple[Any, ...] = (), rows: Sequence[Mapping[str, Any]] = (),
            now: int | None = None) -> list[tuple[Any, ...]]:
        """Bind and run a cached statement; its rows ([] for one that returns none)."""
        self.verify_protocol()
        sql_text, params = statement.bind(self.using, values or {}, shape, rows, now)
        with connections[self.using].cursor() as cursor:
            prefix = statement_prefix() if self.dialect.has_round_trip_engine else None
            if prefix is not None and is_client_binding(cursor):
                # The worker's statement timeout, in the same round trip (timeouts.py).
                return run_batch(cursor, prefix + sql_text, params, skip=1, read=1)[0]
            cursor.execute(sql_text, params)
            return cursor.fetchall() if returns_rows(cursor) else []

    def run_sql(self, sql_text: str, params: Sequence[Any] = ()) -> None:
        """Run SQL text (store/sql.py) for its effect."""
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql_text, params)

    def records(self, statement: Statement, values: dict[str, Any] | None = None,
                shape: tuple[Any, ...] = (),
                rows: Sequence[Mapping[str, Any]] = ()) -> list[TaskRecord]:
        """Run a statement that returns whole task rows, as records."""
        return [TaskRecord.from_sequence(row) for row in self.run(statement, values, shape, rows)]

    def record(self, statement: Statement, values: dict[str, Any]) -> TaskRecord | None:
        """The first task row a statement returns, or None."""
        found = self.records(statement, values)
        return found[0] if found else None

    def fetch(self, queryset: QuerySet[Any, Any]) -> list[TaskRecord]:
        """Evaluate a task QuerySet of this alias into records, columns read as the codec needs."""
        self.verify_protocol()
        sql_text, params = select_sql(task_columns(queryset))
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql_text, params)
            return [TaskRecord.from_sequence(row) for row in cursor.fetchall()]

    def tasks(self) -> TaskQuerySet:
        """The Task QuerySet of this alias (querysets.TaskQuerySet)."""
        return tasks_of(self.using)

    def atomic(self) -> transaction.Atomic:
        """A write transaction (or savepoint inside the caller's) on this alias."""
        return transaction.atomic(using=self.using)

    def clock_ms(self) -> int:
        """Now in epoch ms from the queue's clock: the database's on PostgreSQL, this host's on SQLite."""
        if self.dialect.uses_process_clock:
            return now_ms()
        connection = connections[self.using]
        expression, params = NowMs().as_postgresql(None, connection)
        with connection.cursor() as cursor:
            cursor.execute(sql.SELECT_VALUE.format(expression=expression), params)
            return int(cursor.fetchone()[0])

    def refresh_statistics(self) -> None:
        """Let the database refresh its planner statistics where it keeps them stale (SQLite)."""
        if self.dialect.needs_periodic_analyze:
            self.verify_protocol()
            self.run_sql(sql.OPTIMIZE)

    def vacuum_tasks(self) -> int | None:
        """VACUUM the queue table (PostgreSQL); answer its row estimate after, or None if not allowed.

        Runs outside any transaction (VACUUM refuses one), on this thread's connection.
        """
        self.verify_protocol()
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql.TASKS_UPKEEP)
            allowed, _ = cursor.fetchone()
            if not allowed:
                return None
            cursor.execute(sql.VACUUM_TASKS)
            cursor.execute(sql.TASKS_UPKEEP)
            return max(0, int(cursor.fetchone()[1]))

    def lock_key(self, key: str) -> None:
        """Serialize keyed writes on `key` until the transaction ends."""
        # SQLite needs none: BEGIN IMMEDIATE already holds the write lock.
        if self.dialect.has_advisory_locks:
            self.run_sql(sql.LOCK_KEY, [key])

    def verify_protocol(self) -> None:
        """Raise unless the alias's tables speak this package's protocol version (once per alias)."""
        if self.using in _verified_aliases:
            return
        with _verify_lock:
            if self.using in _verified_aliases:
                return
            if not apps.is_installed("cairnq_django"):
                # Its models do not exist, and `migrate cairnq_django` says
                # "No installed app with label 'cairnq_django'".
                raise CairnQError(
                    "cairnq_django is not in INSTALLED_APPS, so it has no tables to use: add "
                    "'cairnq_django' to INSTALLED_APPS, then run "
                    f"`manage.py migrate cairnq_django --database {self.using}`."
                )
            found = self._read_protocol_version()
            if found is None or str(found).split(".")[0] != str(PROTOCOL_VERSION):
                raise ProtocolVersionMismatch(
                    f"Database {self.using!r} speaks CairnQ protocol_version {found!r}; "
                    f"cairnq_django speaks {PROTOCOL_VERSION}."
                )
            _verified_aliases.add(self.using)

    def _read_protocol_version(self) -> Any:
        # Inside the caller's transaction the read gets a savepoint (once per
        # process), so that after a failure the catalog can still be asked why.
        connection = connections[self.using]
        guard = self.atomic() if connection.in_atomic_block else nullcontext()
        try:
            with guard:
                return (
                    ProtocolMeta.objects.using(self.using)
                    .filter(key="protocol_version").values_list("value", flat=True).first()
                )
        except Exception as exc:
            raise unreadable_meta_error(self.using, exc) from exc
