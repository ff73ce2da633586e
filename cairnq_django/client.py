"""The functions application code calls: enqueue, inspect, control and wait for tasks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone

from . import declared, signals, validators, waiting
from .conf import cairnq_settings, to_ms
from .flow.backpressure import wait_for_headroom
from .records import DEFAULT_CONFLICT, TaskRecord, TaskSpec
from .store import ApplicationOperations, attempts, get_store
from .store.attempts import TaskHistory

# What a wait function returns: a TaskRecord, or (waiting.await_) a coroutine of one.
_Waited = TypeVar("_Waited")


@dataclass(slots=True)
class PendingTask:
    """What an on_commit enqueue returns, filled in once the task is written.

    `id` is the id the new task will have; `task` is None until the caller's
    transaction commits and the write happens. A keyed enqueue that reuses a
    live task then points `id` and `task` at that task instead.
    """

    id: str
    name: str
    queue: str
    key: str | None = None
    task: TaskRecord | None = None

    @property
    def written(self) -> bool:
        return self.task is not None


def _check_key(key: Any) -> None:
    validators.check_label("key", key, validators.MAX_KEY_LENGTH, optional=True)


def enqueue(
    name: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    key: str | None = None,
    conflict: str = DEFAULT_CONFLICT,
    max_attempts: int | None = None,
    priority: int | None = None,
    metadata: dict[str, Any] | None = None,
    delay: timedelta | int | None = None,
    run_at: datetime | None = None,
    correlation_id: str | None = None,
    concurrency_key: str | None = None,
    using: str | None = None,
    on_commit: bool | None = None,
) -> TaskRecord | PendingTask:
    """Queue a task named `name` with a JSON payload and return its row.

    Inside `transaction.atomic()` on the queue's database the task commits or
    rolls back with the caller's data. With `on_commit=True` (or
    settings.CAIRNQ['ENQUEUE_ON_COMMIT']) the write waits for the caller's
    transaction on the default database to commit, for a queue kept in a
    separate database; a PendingTask is returned then.

    `concurrency_key` ("account:42") puts the task under the key_prefix
    limits whose prefix it starts with (flow/limits.py): at most their
    concurrency of that key's tasks run at once, fleet-wide.

    `queue`, `max_attempts` and `priority` left at None take what the
    handler of `name` declares (`@task(max_attempts=2)`) when this process
    registered it, else the protocol's defaults ("default", 3, 0).
    """
    store = get_store(using)
    validators.check_conflict(conflict)
    _check_key(key)
    options = declared.row_options(
        name, queue=queue, max_attempts=max_attempts, priority=priority
    )
    queue = options.queue
    metadata, announced = signals.enqueuing(name, queue, metadata)
    try:
        spec = store.prepare(
            name,
            payload,
            queue=queue,
            max_attempts=options.max_attempts,
            priority=options.priority,
            metadata=metadata,
            correlation_id=correlation_id,
            delay_ms=validators.delay_ms(delay, run_at, timezone.now()),
            concurrency_key=concurrency_key,
        )
        if on_commit is None:
            on_commit = cairnq_settings.ENQUEUE_ON_COMMIT
        task: TaskRecord | PendingTask
        if on_commit:
            task = pending = PendingTask(id=spec["id"], name=name, queue=queue, key=key)
            transaction.on_commit(
                partial(_write, store, spec, key, conflict, pending), using=DEFAULT_DB_ALIAS
            )
        else:
            task = _write(store, spec, key, conflict)
    except BaseException as exc:
        if announced:
            signals.enqueued(metadata, error=exc)
        raise
    if announced:
        signals.enqueued(metadata, task=task)
    return task


def _write(
    store: ApplicationOperations,
    spec: TaskSpec,
    key: str | None,
    conflict: str,
    pending: PendingTask | None = None,
) -> TaskRecord:
    wait_for_headroom(store, spec["queue"])
    task = store.submit_prepared(spec, key=key, conflict=conflict)
    if pending is not None:
        pending.id, pending.task = task.id, task
    return task


_MANY_OPTIONS = {
    "queue", "key", "conflict", "max_attempts", "priority", "metadata", "delay", "run_at",
    "correlation_id", "concurrency_key",
}


def enqueue_many(
    tasks: Iterable[Mapping[str, Any] | tuple[str, Any]],
    *,
    using: str | None = None,
) -> list[TaskRecord]:
    """Queue many tasks in one transaction; all are validated before any is written.

    Each item is a `(name, payload)` pair or a dict with `name`, `payload` and
    any of enqueue()'s keyword options.
    """
    store = get_store(using)
    specs: list[TaskSpec] = []
    keys: list[tuple[str | None, str]] = []
    announced: list[tuple[int, Any]] = []
    try:
        for index, item in enumerate(tasks):
            if isinstance(item, tuple):
                # (name, payload) takes every default, or what its handler declares.
                if not 1 <= len(item) <= 2:
                    raise ValueError(
                        f"enqueue_many item {index} must be (name,) or (name, payload); "
                        f"got a tuple of {len(item)}."
                    )
                item = dict(zip(("name", "payload"), item, strict=False))
            item = dict(item)
            unknown = set(item) - _MANY_OPTIONS - {"name", "payload"}
            if unknown or "name" not in item:
                raise ValueError(
                    f"enqueue_many item {index} needs 'name' and takes only "
                    f"{', '.join(sorted(_MANY_OPTIONS | {'payload'}))}; got {sorted(item)}."
                )
            conflict = item.get("conflict", DEFAULT_CONFLICT)
            try:
                validators.check_conflict(conflict)
            except ValueError as exc:
                raise ValueError(f"enqueue_many item {index}: {exc}") from None
            options = declared.row_options(
                item["name"], queue=item.get("queue"), max_attempts=item.get("max_attempts"),
                priority=item.get("priority"),
            )
            metadata, sent = signals.enqueuing(item["name"], options.queue, item.get("metadata"))
            if sent:
                announced.append((len(specs), metadata))
            specs.append(
                store.prepare(
                    item["name"],
                    item.get("payload"),
                    queue=options.queue,
                    max_attempts=options.max_attempts,
                    priority=options.priority,
                    metadata=metadata,
                    correlation_id=item.get("correlation_id"),
                    delay_ms=validators.delay_ms(item.get("delay"), item.get("run_at"), timezone.now()),
                    concurrency_key=item.get("concurrency_key"),
                )
            )
            _check_key(item.get("key"))
            keys.append((item.get("key"), conflict))
        for queue in {spec["queue"] for spec in specs}:
            wait_for_headroom(store, queue)
        written = store.submit_many(specs, keys=keys)
    except BaseException as exc:
        for _, metadata in announced:
            signals.enqueued(metadata, error=exc)
        raise
    for index, metadata in announced:
        signals.enqueued(metadata, task=written[index])
    return written


def get(task_id: str, *, using: str | None = None) -> TaskRecord | None:
    """Return a task by id, or None."""
    return get_store(using).get(task_id)


def get_task(task_id: str, *, using: str | None = None) -> TaskHistory | None:
    """Return a task and its attempts, oldest first (docs/attempts.md), or None."""
    store = get_store(using)
    task = store.get(task_id)
    if task is None:
        return None
    return TaskHistory(task=task, attempts=attempts.history(store.using, task))


def get_by_key(key: str, *, using: str | None = None) -> TaskRecord | None:
    """Return the task a business key currently points at, or None."""
    return get_store(using).get_by_key(key)


def list_tasks(*, using: str | None = None, **filters: Any) -> list[TaskRecord]:
    """List tasks newest first, filtered by status/queue/name/root_id/correlation_id."""
    return get_store(using).list(**filters)


def stats(queue: str | None = None, *, using: str | None = None) -> dict[str, dict[str, int]]:
    """Return {queue: {status: count}} with every status present."""
    return get_store(using).stats(queue)


def cancel(task_id: str, *, using: str | None = None) -> TaskRecord | None:
    """Cancel a queued task, or ask a running one to stop; None if already finished."""
    return get_store(using).cancel(task_id)


def retry(
    task_id: str, *, reset_attempt: bool = False, using: str | None = None
) -> TaskRecord | None:
    """Queue a failed or canceled task again; None if it is in another state."""
    return get_store(using).retry(task_id, reset_attempt=reset_attempt)


def purge(
    *,
    older_than: timedelta | int = 0,
    queue: str | None = None,
    status: str | None = None,
    name: str | None = None,
    limit: int = 1000,
    using: str | None = None,
) -> list[str]:
    """Delete up to `limit` finished tasks older than `older_than`; return their ids."""
    older_than_ms = validators.check_integer("older_than", to_ms(older_than), minimum=0)
    return get_store(using).purge(
        older_than_ms=older_than_ms, queue=queue, status=status, name=name, limit=limit
    )


def wait(
    task_id: str,
    *,
    timeout: float | timedelta | None = None,
    poll_initial: int | None = None,
    poll_max: int | None = None,
    raise_on_failure: bool = True,
    using: str | None = None,
) -> TaskRecord:
    """Block until a task finishes; raise TaskFailed/TaskCanceled/TaskTimeout as fitting.

    `timeout` is seconds (or a timedelta); the poll bounds are milliseconds.
    A database that goes away meanwhile (a restart) is reconnected to with
    backoff until the timeout; TaskTimeout then says it was unreachable.
    """
    return _wait_with(
        waiting.wait, using, timeout, poll_initial, poll_max, raise_on_failure, task_id=task_id
    )


def wait_by_key(
    key: str,
    *,
    timeout: float | timedelta | None = None,
    poll_initial: int | None = None,
    poll_max: int | None = None,
    raise_on_failure: bool = True,
    using: str | None = None,
) -> TaskRecord:
    """Block until the task a key points at finishes (following replacements).

    On timeout, TaskTimeout.key is the key and TaskTimeout.task_id the task it
    pointed at, or the key itself when it pointed at nothing.
    """
    return _wait_with(
        waiting.wait, using, timeout, poll_initial, poll_max, raise_on_failure, key=key
    )


def call(
    name: str,
    payload: Any = None,
    *,
    timeout: float | timedelta | None = None,
    poll_initial: int | None = None,
    poll_max: int | None = None,
    using: str | None = None,
    **options: Any,
) -> Any:
    """Enqueue a task, wait for it, and return its result."""
    task = _enqueue_to_call(name, payload, using, options)
    done = wait(
        task.id, timeout=timeout, poll_initial=poll_initial, poll_max=poll_max, using=using
    )
    return done.result


def _enqueue_to_call(
    name: str, payload: Any, using: str | None, options: dict[str, Any]
) -> TaskRecord | PendingTask:
    """call()'s enqueue: refused inside a transaction, which no worker could see past."""
    waiting.refuse_inside_transaction(get_store(using).using)
    return enqueue(name, payload, using=using, on_commit=False, **options)


def _wait_with(
    wait_fn: Callable[..., _Waited],
    using: str | None,
    timeout: float | timedelta | None,
    poll_initial: int | None,
    poll_max: int | None,
    raise_on_failure: bool,
    **lookup: str,
) -> _Waited:
    """Call waiting.wait or waiting.await_ (`wait_fn`) with the client's options, for `lookup`."""
    return wait_fn(
        get_store(using),
        timeout=timeout.total_seconds() if isinstance(timeout, timedelta) else timeout,
        poll_initial_ms=poll_initial,
        poll_max_ms=poll_max,
        raise_on_failure=raise_on_failure,
        **lookup,
    )


aenqueue = sync_to_async(enqueue)
aenqueue_many = sync_to_async(enqueue_many)
aget = sync_to_async(get)
aget_task = sync_to_async(get_task)
aget_by_key = sync_to_async(get_by_key)
alist_tasks = sync_to_async(list_tasks)
astats = sync_to_async(stats)
acancel = sync_to_async(cancel)
aretry = sync_to_async(retry)
apurge = sync_to_async(purge)


async def await_task(
    task_id: str,
    *,
    timeout: float | timedelta | None = None,
    poll_initial: int | None = None,
    poll_max: int | None = None,
    raise_on_failure: bool = True,
    using: str | None = None,
) -> TaskRecord:
    """Async wait(): the sleeps between probes never hold a thread."""
    return await _wait_with(
        waiting.await_, using, timeout, poll_initial, poll_max, raise_on_failure, task_id=task_id
    )


async def await_task_by_key(
    key: str,
    *,
    timeout: float | timedelta | None = None,
    poll_initial: int | None = None,
    poll_max: int | None = None,
    raise_on_failure: bool = True,
    using: str | None = None,
) -> TaskRecord:
    """Async wait_by_key()."""
    return await _wait_with(
        waiting.await_, using, timeout, poll_initial, poll_max, raise_on_failure, key=key
    )


async def acall(
    name: str,
    payload: Any = None,
    *,
    timeout: float | timedelta | None = None,
    poll_initial: int | None = None,
    poll_max: int | None = None,
    using: str | None = None,
    **options: Any,
) -> Any:
    """Async call(): enqueue, wait, return the result."""
    task = await sync_to_async(_enqueue_to_call)(name, payload, using, options)
    done = await await_task(
        task.id, timeout=timeout, poll_initial=poll_initial, poll_max=poll_max, using=using
    )
    return done.result
