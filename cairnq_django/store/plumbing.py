"""The store's plumbing: running its statements on the alias's connection, its clock, its checks."""

from __future__ import annotations

import threading
from collections.abc import Sequence

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
from . import queries as q
from . import sql
from .encoding import record
from .statements import Statement, select_sql

_verified_aliases: set[str] = set()
_verify_lock = threading.Lock()


def unreadable_meta_error(using: str, exc: BaseException) -> Exception:
    """Say why the protocol version could not be read: a missing table only when it is one.

    Anything else (a refused connection, a settings error such as a pool with a
    persistent CONN_MAX_AGE, a permission) is named as what failed; telling the
    operator to migrate then would send them the wrong way.
    """
    if _is_missing_table(exc):
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


def _is_missing_table(exc: BaseException) -> bool:
    # PostgreSQL's SQLSTATE 42P01 (undefined_table) on the driver's error;
    # SQLite has no codes for it, only its message.
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if getattr(cause, "sqlstate", None) == "42P01" or getattr(cause, "pgcode", None) == "42P01":
        return True
    return isinstance(exc, OperationalError) and "no such table" in str(exc)


class StoreBase:
    """What every store operation runs through, for one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.dialect: Dialect = dialect_of(using)

    def _run(self, statement: Statement, values: dict | None = None, shape: tuple = (),
             rows: Sequence[dict] = (), now: int | None = None) -> list[tuple]:
        self._verify_protocol()
        if self.dialect.has_row_locks and not statement.compiled(self.using, shape):
            # Django compiles select_for_update() only inside a transaction.
            with transaction.atomic(using=self.using):
                statement.template(self.using, shape)
        sql, params = statement.bind(self.using, values or {}, shape, rows, now)
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []

    def _tasks(self, statement: Statement, values: dict | None = None, shape: tuple = (),
               rows: Sequence[dict] = ()) -> list[TaskRecord]:
        return [record(row) for row in self._run(statement, values, shape, rows)]

    def _task(self, statement: Statement, values: dict | None = None, shape: tuple = ()) -> TaskRecord | None:
        found = self._tasks(statement, values, shape)
        return found[0] if found else None

    def _fetch(self, queryset: QuerySet) -> list[TaskRecord]:
        """Evaluate a task QuerySet of this alias into records, columns read as the codec needs."""
        self._verify_protocol()
        sql, params = select_sql(q.task_columns(queryset))
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return [record(row) for row in cursor.fetchall()]

    def tasks(self) -> TaskQuerySet:
        """The Task QuerySet of this alias (querysets.TaskQuerySet)."""
        return q.tasks_of(self.using)

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
            self._verify_protocol()
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql.OPTIMIZE)

    def atomic(self):
        """A write transaction (or savepoint inside the caller's) on this alias."""
        return transaction.atomic(using=self.using)

    def _verify_protocol(self) -> None:
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
            try:
                found = (
                    ProtocolMeta.objects.using(self.using)
                    .filter(key="protocol_version").values_list("value", flat=True).first()
                )
            except Exception as exc:
                raise unreadable_meta_error(self.using, exc) from exc
            if found is None or str(found).split(".")[0] != str(PROTOCOL_VERSION):
                raise ProtocolVersionMismatch(
                    f"Database {self.using!r} speaks CairnQ protocol_version {found!r}; "
                    f"cairnq_django speaks {PROTOCOL_VERSION}."
                )
            _verified_aliases.add(self.using)

    def _lock_key(self, key: str) -> None:
        # SQLite needs none: BEGIN IMMEDIATE already holds the write lock.
        if self.dialect.has_advisory_locks:
            with connections[self.using].cursor() as cursor:
                cursor.execute(sql.LOCK_KEY, [key])

