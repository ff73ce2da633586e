"""The store's statements, one per protocol operation, each built from Task QuerySets.

Each builder returns an ORM statement (querysets.TaskQuerySet for the WHERE,
transitions.py for the SET) that statement_cache.Statement compiles once per
alias and shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db.models import Case, Exists, F, QuerySet, Subquery, Value, When
from django.db.models.expressions import Expression

from ..db import transitions
from ..db.dialects import dialect_of
from ..db.expressions import (
    JsonParam,
    NowMs,
    RawText,
    Slot,
    int_param,
    now_plus,
    text_param,
)
from ..db.querysets import TaskQuerySet, one_of
from ..drained import DRAINED_CHANNEL
from ..models import ProtocolMeta, QueueState, Task, TaskKey
from ..records import COLUMNS
from . import sql
from .django_private import (
    Template,
    delete_sql,
    insert_rows_sql,
    qmark,
    select_sql,
    update_sql,
    upsert_sql,
)
from .statement_cache import Statement


def tasks_of(using: str) -> TaskQuerySet:
    return Task.objects.using(using)


# The whole row in records.COLUMNS order, free-text columns read raw (RawText).
ROW_COLUMNS: tuple[Expression | F, ...] = tuple(RawText.for_column(c) for c in COLUMNS)


def task_columns(queryset: QuerySet[Any, Any]) -> QuerySet[Any, Any]:
    """The whole row, every free-text column raw, for the codec to decode."""
    return queryset.values_list(*ROW_COLUMNS)


def _texts(name: str, count: int) -> list[Any]:
    return [text_param(f"{name}{i}") for i in range(count)]


# One draw of a claim: the names it takes (None: any) and how many at most.
Draw = tuple[Sequence[str] | None, int]


def draw_values(queues: Sequence[str], names: Sequence[str] | None) -> dict[str, Any]:
    values = {f"q{i}": queue for i, queue in enumerate(queues)}
    values.update({f"n{i}": name for i, name in enumerate(names or ())})
    return values


def claim_shape(
    queues: Sequence[str], names: Sequence[str] | None, limit: int
) -> tuple[int, int | None, int]:
    return (len(queues), None if names is None else len(names), limit)


def _claimable(using: str, queues: int, names: int | None) -> TaskQuerySet:
    return tasks_of(using).claimable(
        _texts("q", queues), None if names is None else _texts("n", names)
    ).exclude(queue__in=paused_queues_of(using))


def paused_queues_of(using: str) -> QuerySet:
    """Flow control (flow/pausing.py): the claim, its probe and the drained check skip these."""
    return QueueState.objects.using(using).filter(paused=True).values("queue")


def _returning_row(queryset: QuerySet[Any, Any], values: dict[str, Any]) -> Template:
    return update_sql(queryset, values, ROW_COLUMNS)


def _owned_update(transition: Callable[[], dict[str, Any]]) -> Statement:
    return Statement(lambda using: _returning_row(
        tasks_of(using).filter(id=text_param("id")).owned(text_param("worker_id")), transition()
    ))


def _build_insert(using: str, count: int) -> Template:
    """`count` rows of the one-row INSERT the ORM compiles (django_private.insert_rows_sql)."""
    fields = ("id", "name", "queue", "status", "payload", "metadata", "max_attempts",
              "priority", "run_at_ms", "parent_id", "root_id", "correlation_id",
              "created_at_ms", "updated_at_ms")
    row = Task(
        id=text_param("id", 0), name=text_param("name", 0), queue=text_param("queue", 0),
        status=Value("queued"), payload=JsonParam("payload", 0),
        metadata=JsonParam("metadata", 0), max_attempts=int_param("max_attempts", 0),
        priority=int_param("priority", 0), run_at_ms=now_plus(int_param("delay_ms", 0)),
        parent_id=text_param("parent_id", 0), root_id=text_param("root_id", 0),
        correlation_id=text_param("correlation_id", 0),
        created_at_ms=NowMs(), updated_at_ms=NowMs(),
    )
    # The clock comes back so records need not be read back; SQLite's is this process's.
    returning = () if dialect_of(using).uses_process_clock else ("created_at_ms",)
    return insert_rows_sql(row, fields, using, count, _row_slot, returning)


def _row_slot(param: Any, row: int) -> Any:
    return Slot(param.name, row) if isinstance(param, Slot) and param.row is not None else param


def _build_point_key(using: str) -> Template:
    key = TaskKey(key=text_param("key"), task_id=text_param("task_id"),
                  created_at_ms=NowMs(), updated_at_ms=NowMs())
    return upsert_sql(
        key, ("key", "task_id", "created_at_ms", "updated_at_ms"), using,
        unique_fields=("key",), update_fields=("task", "updated_at_ms"),
    )


def _build_purge(using: str, limit: int, queue: bool, status: bool, name: bool) -> Template:
    doomed = (
        tasks_of(using)
        .purgeable(
            int_param("older_than_ms"),
            queue=text_param("queue") if queue else None,
            status=text_param("status") if status else None,
            name=text_param("name") if name else None,
        )
        .oldest_completed_first()
        .values("id")[:limit]
        .select_for_update(skip_locked=True)
    )
    return delete_sql(tasks_of(using).filter(id__in=doomed), (F("id"), F("completed_at_ms")))


def _build_purge_ids(using: str, count: int) -> Template:
    ids = [text_param("id", i) for i in range(count)]
    return delete_sql(tasks_of(using).filter(one_of("id", ids)).terminal(), (F("id"),))


def _build_probe(using: str, queues: int, names: int | None, due: bool) -> Template:
    """Is there claimable work or an expired lease (HAS_CLAIMABLE)?

    With `due` (IDLE_PROBE), also how long until the earliest queued task of
    these names falls due: an idle worker sleeps until then (runner.py) instead of finding a delayed
    task or a retry at its next rare poll. The earliest run_at of the
    not-yet-due rows is read from the claim index's (queue, status[, name])
    range; priority comes before run_at in the index, so it is a scan of the
    queued, not-yet-due rows of these names, which an idle worker's queues
    hold only as delayed work.
    """
    columns: dict[str, Any] = {
        "work": Exists(_claimable(using, queues, names).order_by()),
        "expired": Exists(tasks_of(using).expired_leases()),
    }
    if due:
        future = (
            tasks_of(using)
            .queued()
            .filter(one_of("queue", _texts("q", queues)), run_at_ms__gt=NowMs())
            .exclude(queue__in=paused_queues_of(using))
        )
        if names is not None:
            future = future.filter(one_of("name", _texts("n", names)))
        earliest = future.order_by("run_at_ms").values("run_at_ms")[:1]
        columns["due_in_ms"] = Subquery(earliest) - NowMs()
    probe = (
        ProtocolMeta.objects.using(using)
        .filter(key="protocol_version")
        .annotate(**columns)
        .values_list(*columns)
    )
    return select_sql(probe)


def _build_claim(using: str, queues: int, names: int | None, limit: int) -> Template:
    chosen = (
        _claimable(using, queues, names).values("id")[:limit].select_for_update(skip_locked=True)
    )
    return _returning_row(tasks_of(using).filter(id__in=chosen), transitions.claim())


def _build_claim_ids(using: str, count: int) -> Template:
    """The claim's transition on chosen rows (the limited claim's), each still queued."""
    ids = [text_param("id", i) for i in range(count)]
    queued = tasks_of(using).filter(one_of("id", ids)).queued()
    return _returning_row(queued, transitions.claim())


def _build_recover(using: str) -> Template:
    expired = tasks_of(using).expired_leases().values("id").select_for_update(skip_locked=True)
    return _returning_row(tasks_of(using).filter(id__in=expired), transitions.recover_lease())


def _build_renew_many(using: str, count: int) -> Template:
    ids = [text_param("id", i) for i in range(count)]
    return update_sql(
        tasks_of(using).filter(one_of("id", ids)).owned(text_param("worker_id")),
        transitions.renew(), (F("id"), F("cancel_requested_at_ms")),
    )


def _build_complete_many(using: str, count: int) -> Template:
    ids = [text_param("id", i) for i in range(count)]
    result = Case(*(When(id=ids[i], then=JsonParam("result", i)) for i in range(count)))
    return _returning_row(
        tasks_of(using).filter(one_of("id", ids)).owned(text_param("worker_id")),
        transitions.complete(result),
    )


def _probe(queryset: QuerySet[Any, Any]) -> Template:
    """Whether any row matches, as SQL for a plain sqlite3 connection (the file wakeup's)."""
    sql, params = select_sql(queryset.order_by().values_list(Value(1))[:1])
    return qmark(sql), params


INSERT = Statement(_build_insert)
QUEUED_PROBE = Statement(lambda using, queues: _probe(_claimable(using, queues, None)))
LIVE_PROBE = Statement(lambda using: _probe(tasks_of(using).filter(id=text_param("id")).live()))
GET = Statement(lambda using: select_sql(
    task_columns(tasks_of(using).filter(id=text_param("id")))
))
BY_KEY = Statement(lambda using: select_sql(
    task_columns(tasks_of(using).by_key(text_param("key")))
))
STATUS = Statement(lambda using: select_sql(
    tasks_of(using).filter(id=text_param("id")).values_list("id", "status")
))
STATUS_BY_KEY = Statement(lambda using: select_sql(
    tasks_of(using).by_key(text_param("key")).values_list("id", "status")
))
KEY_TARGET = Statement(lambda using: select_sql(
    TaskKey.objects.using(using).filter(key=text_param("key")).values_list("task_id")
))
CANCEL = Statement(lambda using: _returning_row(
    tasks_of(using).filter(id=text_param("id")).live(), transitions.cancel()
))
RETRY = Statement(lambda using: _returning_row(
    tasks_of(using).retryable().filter(id=text_param("id")),
    transitions.retry(),
))
POINT_KEY = Statement(_build_point_key)
PURGE = Statement(_build_purge)
PURGE_IDS = Statement(_build_purge_ids)
HAS_CLAIMABLE = Statement(lambda using, queues, names: _build_probe(using, queues, names, due=False))
IDLE_PROBE = Statement(lambda using, queues, names: _build_probe(using, queues, names, due=True))
RECOVER = Statement(_build_recover)
CLAIM = Statement(_build_claim)
CLAIM_IDS = Statement(_build_claim_ids)
RENEW = _owned_update(transitions.renew)
RENEW_MANY = Statement(_build_renew_many)
PROGRESS = _owned_update(transitions.report_progress)
SUCCEED = _owned_update(transitions.succeed)
COMPLETE = _owned_update(transitions.complete)
COMPLETE_MANY = Statement(_build_complete_many)
FAIL = _owned_update(transitions.fail)
METADATA = _owned_update(transitions.replace_metadata)
SNOOZE = _owned_update(transitions.snooze)


def drained_notify_sql(
    using: str, queues: Sequence[str], key: str, names: Sequence[str]
) -> tuple[str, list[Any]]:
    """SELECT pg_notify(drained channel, key) if nothing is claimable for `names` (drained.py)."""
    shape = (len(queues), len(names))
    probe, probe_params = HAS_CLAIMABLE.bind(using, draw_values(queues, names), shape)
    # The probe is a compiled statement; every value in it is a bound parameter.
    return sql.DRAINED_NOTIFY.format(probe=probe), [DRAINED_CHANNEL, key, *probe_params]
