"""The store's plumbing: running its statements on the alias's connection, its clock, its checks."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from django.apps import apps
from django.db import connections, transaction
from django.db.models import QuerySet

from ..errors import CairnQError, ProtocolVersionMismatch
from ..ids import now_ms
from ..querysets import TaskQuerySet
from ..records import TaskRecord
from ..schema import PROTOCOL_VERSION
from . import queries as q
from . import sql
from .dialects import Dialect, dialect_of
from .encoding import record
from .expressions import NowMs
from .statements import Statement, select_sql

_verified_aliases: set[str] = set()
_verify_lock = threading.Lock()


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
                    q.models().ProtocolMeta.objects.using(self.using)
                    .filter(key="protocol_version").values_list("value", flat=True).first()
                )
            except Exception as exc:
                raise CairnQError(
                    f"The CairnQ tables are missing from database {self.using!r}; "
                    f"run `manage.py migrate cairnq_django --database {self.using}`. ({exc})"
                ) from exc
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

