"""Run enqueued tasks inside your own tests: `cairnq_django.testing`.

    from cairnq_django.testing import run_tasks

    def test_signup_sends_the_welcome_email(client):
        with run_tasks() as tasks:
            client.post("/signup/", {"email": "ann@example.com"})
            ran = tasks.drain()
        assert [r.task.name for r in ran] == ["send_welcome"]

Two modes, for `cairnq_django.enqueue` tasks and framework (`django.tasks`)
tasks alike, with the real handlers, the real TaskContext and the real
settling writes, in the test's own thread and database connection (so inside
TestCase's or pytest-django's transaction too):

- drain (default): tasks queue as in production; `drain()` runs every due
  task whose name has a handler, until none is left, and returns what ran.
- inline (`run_tasks(inline=True)`): a task runs as soon as the transaction
  that enqueued it commits, as a worker would first see it; right away when no
  transaction is open. A task enqueued in a block that rolls back never runs.
  Inside a test's own transaction, "commits" means the outermost `atomic()`
  the code under test opened exits without an error.

A due task whose name has no handler in the runner's registry (a typo in the
enqueued name, a module that is not imported) fails the test loudly:
`drain()`, and inline mode when the task's transaction commits, raise
`UnhandledTask` naming it. `allow_unhandled=True` leaves such tasks queued
instead (for names a worker in another language runs).

Retries are off unless `retries=True`: a failing task then fails for good at
once. With retries on, a retryable failure is run again at once (no backoff)
until its attempts are used up. Handler exceptions are caught and recorded in
`Ran.exception`; `raise_exceptions=True` re-raises the first one instead
(never a Snooze). A snoozed task is queued again for later, as in production:
`drain()` runs it again only once its delay has passed.

pytest users get the fixtures `cairnq_tasks` (drain) and `cairnq_tasks_inline`
with `pytest_plugins = ["cairnq_django.testing"]` in their conftest.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, transaction

from . import signals
from .errors import CairnQError, LostLease, SerializationError, Snooze
from .ids import ulid
from .records import TaskRecord
from .store import get_store
from .worker.context import TaskContext
from .worker.envelopes import as_envelope
from .worker.registry import Registry, autodiscover
from .worker.registry import registry as default_registry

# Long enough that no test outlives it; nothing renews it in a test.
_LEASE_MS = 3_600_000


class UnhandledTask(CairnQError, AssertionError):
    """Due tasks of the test have no handler, so the runner cannot run them.

    An AssertionError too, so a test framework reports it as the test's failure.
    `tasks` are the rows, as read when the runner gave up on them.
    """

    def __init__(self, tasks: list[TaskRecord], registered: list[str]) -> None:
        shown = ", ".join(f"{t.name!r} ({t.id})" for t in tasks[:5])
        if len(tasks) > 5:
            shown += f" and {len(tasks) - 5} more"
        super().__init__(
            f"{len(tasks)} queued task(s) have no handler here and would never run: {shown}. "
            f"Handlers registered: {', '.join(registered) or '(none)'}. Register one with "
            "@cairnq_django.task in an installed app's tasks.py (or a Tasks-framework @task "
            "on a CairnQ backend), or fix the name the code enqueues; "
            "run_tasks(allow_unhandled=True) leaves such tasks queued instead."
        )
        self.tasks = list(tasks)


@dataclass(frozen=True, slots=True)
class Ran:
    """One attempt a TaskRunner ran: the row as it left it, and what the handler raised."""

    task: TaskRecord
    exception: BaseException | None = None

    @property
    def status(self) -> str:
        return self.task.status


class TaskRunner:
    """Runs due tasks in the calling thread; see the module docstring."""

    def __init__(
        self,
        *,
        inline: bool = False,
        retries: bool = False,
        raise_exceptions: bool = False,
        using: str | None = None,
        registry: Registry | None = None,
        allow_unhandled: bool = False,
    ) -> None:
        if registry is None:
            autodiscover()
        self.registry = registry or default_registry
        self.store = get_store(using)
        self.inline = inline
        self.retries = retries
        self.raise_exceptions = raise_exceptions
        self.allow_unhandled = allow_unhandled
        self.worker_id = f"worker_test_{ulid()}"
        #: Every attempt run so far, in order.
        self.ran: list[Ran] = []

    # ------------------------------------------------------------ draining
    def drain(self, *, raise_exceptions: bool | None = None, limit: int = 10_000) -> list[Ran]:
        """Run due tasks until none with a handler is left; return what ran (at most `limit`).

        Raises UnhandledTask if due tasks without a handler are left then
        (unless allow_unhandled), after running everything else.
        """
        ran: list[Ran] = []
        names = self.registry.names()
        while names and len(ran) < limit:
            queues = sorted(self.store.stats())
            rows = self.store.claim(
                queues=queues or ["default"], worker_id=self.worker_id, lease_ms=_LEASE_MS,
                names=names, limit=1,
            ) if queues else []
            if not rows:
                break
            ran.append(self._run(rows[0]))
        self._raise_first(ran, raise_exceptions)
        if not self.allow_unhandled:
            due = (
                self.store.tasks().due(self.store.clock_ms())
                .exclude(name__in=names).order_by("id")
            )
            unhandled = self.store.executor.fetch(due[:100])
            if unhandled:
                raise UnhandledTask(unhandled, names)
        return ran

    def run_until_finished(self, task_id: str) -> list[Ran]:
        """Run the task `task_id` (and due tasks of its name ahead of it) until it is done."""
        ran: list[Ran] = []
        while True:
            row = self.store.get(task_id)
            if row is None or row.status != "queued":
                break
            if row.name not in self.registry:
                if self.allow_unhandled:
                    break
                raise UnhandledTask([row], self.registry.names())
            claimed = self.store.claim(
                queues=[row.queue], worker_id=self.worker_id, lease_ms=_LEASE_MS,
                names=[row.name], limit=1,
            )
            if not claimed:
                break  # not due yet (a delay or run_after): drain() runs it later
            ran.append(self._run(claimed[0]))
        return ran

    def _raise_first(self, ran: list[Ran], raise_exceptions: bool | None) -> None:
        if raise_exceptions is None:
            raise_exceptions = self.raise_exceptions
        if raise_exceptions:
            for attempt in ran:
                # A Snooze is the handler's answer, not a failure to report.
                if attempt.exception is not None and not isinstance(attempt.exception, Snooze):
                    raise attempt.exception

    # ------------------------------------------------------------ one attempt
    def _run(self, row: TaskRecord) -> Ran:
        registration = self.registry.get(row.name)
        assert registration is not None  # noqa: S101 - only registered names are claimed
        ctx = TaskContext(
            store=self.store, task=row, worker_id=self.worker_id, lease_ms=_LEASE_MS,
            retry_backoff_base_ms=0, retry_backoff_cap_ms=0, retries=self.retries,
        )
        self._send(signals.task_started, task=row)
        started = time.monotonic()
        exception = None
        try:
            args = ([ctx],) if registration.batch is not None else (ctx, row.payload)
            if registration.is_async:
                result = async_to_sync(registration.fn)(*args)
            else:
                result = registration.fn(*args)
        # BaseException, as the worker does: a handler's SystemExit fails its
        # task rather than ending the test run.
        except BaseException as exc:
            exception = exc
            if isinstance(exc, Snooze):
                ctx.snooze_unsettled(exc.delay_ms)
            elif not isinstance(exc, LostLease) and not ctx.settled and not ctx.lost_lease:
                envelope, retryable = as_envelope(exc, registration.retries(exc))
                ctx.fail(envelope, retryable=retryable)
        else:
            if not ctx.settled and not ctx.lost_lease:
                if registration.batch is not None and isinstance(result, dict):
                    result = result.get(row.id)
                try:
                    ctx.succeed(result)
                except SerializationError as exc:
                    ctx.fail_unserializable(exc)
        final = ctx.final or self.store.get(row.id) or row
        self._ended(final, ctx, time.monotonic() - started, exception)
        attempt = Ran(task=final, exception=exception)
        self.ran.append(attempt)
        return attempt

    def _ended(
        self, row: TaskRecord, ctx: TaskContext, duration: float,
        raised: BaseException | None = None,
    ) -> None:
        # The worker's own end-of-task signals, so receivers (and the Tasks
        # framework's task_finished) see a test run as they see a worker's.
        if row.status == "succeeded":
            self._send(signals.task_succeeded, task=row, duration=duration)
        elif row.status == "canceled":
            self._send(signals.task_canceled, task=row, duration=duration)
        elif row.status == "queued" and ctx.snoozed_ms is not None:
            self._send(
                signals.task_snoozed, task=row, duration=duration, delay_ms=ctx.snoozed_ms
            )
        elif row.status == "queued":
            self._send(
                signals.task_retrying, task=row, duration=duration, error=row.error,
                delay_ms=ctx.failure[2] if ctx.failure else 0,
            )
        elif row.status == "failed":
            signals.send_while_handling(
                lambda: self._send(signals.task_failed, task=row, duration=duration, error=row.error),
                raised,
            )

    def _send(self, signal: Any, **kwargs: Any) -> None:
        signal.send(sender=TaskRunner, worker=self, **kwargs)

    # ------------------------------------------------------------ inline mode
    def written(self, rows: list[TaskRecord]) -> None:
        """Called (inline mode) with rows just written: run each once its transaction commits."""
        runner = _RunOnCommit(self, [row.id for row in rows if row.status == "queued"])
        if not runner.task_ids:
            return
        connection = connections[self.store.using]
        if not _in_user_transaction(connection):
            runner()
            return
        # Django forgets an on_commit callback whose savepoint rolls back; one
        # still listed when the outermost block the code opened exits has
        # committed, as far as this test can see (see _exit_atomic).
        transaction.on_commit(runner, using=self.store.using)


class _RunOnCommit:
    """An on_commit callback that runs its tasks once, whichever caller comes first."""

    def __init__(self, runner: TaskRunner, task_ids: list[str]) -> None:
        self.runner = runner
        self.task_ids = task_ids
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        for task_id in self.task_ids:
            self.runner.run_until_finished(task_id)


def _in_user_transaction(connection: Any) -> bool:
    """Is an atomic() block open that the test framework did not open itself?"""
    return connection.in_atomic_block and not all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    )


# Inline runners hook the store's writes and atomic()'s exit while active.
_active: list[TaskRunner] = []
_hook_lock = threading.Lock()
_originals: dict[str, Any] = {}


def _install_hooks() -> None:
    from .store.application import ApplicationOperations

    _originals["submit_prepared"] = ApplicationOperations.submit_prepared
    _originals["submit_many"] = ApplicationOperations.submit_many
    _originals["atomic_exit"] = transaction.Atomic.__exit__

    def submit_prepared(store: Any, spec: Any, **kwargs: Any) -> TaskRecord:
        row = _originals["submit_prepared"](store, spec, **kwargs)
        _notify(store, [row])
        return row

    def submit_many(store: Any, specs: Any, **kwargs: Any) -> list[TaskRecord]:
        rows = _originals["submit_many"](store, specs, **kwargs)
        _notify(store, rows)
        return rows

    def atomic_exit(atomic: Any, exc_type: Any, exc_value: Any, tb: Any) -> Any:
        outcome = _originals["atomic_exit"](atomic, exc_type, exc_value, tb)
        if exc_type is None and not getattr(atomic, "_from_testcase", False):
            _flush(atomic.using)
        return outcome

    # The wrappers pass every argument through, so they take what the methods take.
    ApplicationOperations.submit_prepared = submit_prepared  # type: ignore[method-assign,assignment]
    ApplicationOperations.submit_many = submit_many  # type: ignore[method-assign,assignment]
    transaction.Atomic.__exit__ = atomic_exit  # type: ignore[method-assign]


def _remove_hooks() -> None:
    from .store.application import ApplicationOperations

    ApplicationOperations.submit_prepared = _originals.pop("submit_prepared")  # type: ignore[method-assign]
    ApplicationOperations.submit_many = _originals.pop("submit_many")  # type: ignore[method-assign]
    transaction.Atomic.__exit__ = _originals.pop("atomic_exit")  # type: ignore[method-assign]


def _notify(store: Any, rows: list[TaskRecord]) -> None:
    for runner in list(_active):
        if runner.store.using == store.using:
            runner.written(rows)
            return


def _flush(using: str | None) -> None:
    """Run the inline tasks of transactions that just committed up to the test's level."""
    connection = connections[using or "default"]
    if _in_user_transaction(connection):
        return
    survivors = [
        entry for entry in connection.run_on_commit if isinstance(entry[1], _RunOnCommit)
    ]
    if not survivors:
        return
    connection.run_on_commit = [
        entry for entry in connection.run_on_commit if not isinstance(entry[1], _RunOnCommit)
    ]
    # django-stubs 5.2 types the entries as pairs; Django's are (savepoint ids, func, robust).
    for _, callback, _ in survivors:  # type: ignore[misc]
        callback()


@contextmanager
def run_tasks(
    *,
    inline: bool = False,
    retries: bool = False,
    raise_exceptions: bool = False,
    using: str | None = None,
    registry: Registry | None = None,
    allow_unhandled: bool = False,
) -> Iterator[TaskRunner]:
    """Yield a TaskRunner; with inline=True, tasks run as their transactions commit."""
    runner = TaskRunner(
        inline=inline, retries=retries, raise_exceptions=raise_exceptions, using=using,
        registry=registry, allow_unhandled=allow_unhandled,
    )
    if not inline:
        yield runner
        return
    with _hook_lock:
        if not _active:
            _install_hooks()
        _active.insert(0, runner)
    try:
        yield runner
    finally:
        with _hook_lock:
            _active.remove(runner)
            if not _active:
                _remove_hooks()
    runner._raise_first(runner.ran, None)


try:
    import pytest
except ImportError:  # pytest is optional: TestCase users need only run_tasks()
    pass
else:

    @pytest.fixture
    def cairnq_tasks(db: Any) -> Iterator[TaskRunner]:
        """A drain-mode TaskRunner: call `.drain()` to run what the test enqueued."""
        with run_tasks() as runner:
            yield runner

    @pytest.fixture
    def cairnq_tasks_inline(db: Any) -> Iterator[TaskRunner]:
        """An inline-mode TaskRunner: tasks run as their transactions commit."""
        with run_tasks(inline=True) as runner:
            yield runner
