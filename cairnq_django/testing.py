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
  that enqueued it commits, as a worker would first see it (an on_commit
  callback); right away when no transaction is open. A task enqueued in a
  block that rolls back never runs. Inside a test's own transaction nothing
  commits: wrap the code in `TestCase.captureOnCommitCallbacks(execute=True)`
  (pytest-django: `django_capture_on_commit_callbacks`) to run them.

A due task whose name has no handler in the runner's registry (a typo in the
enqueued name, a module that is not imported) fails the test loudly:
`drain()` raises `UnhandledTask` naming it, and so does inline mode: from the
enqueue, or for a task that waited for a commit, when the `with` block ends.
`allow_unhandled=True` leaves such tasks queued instead (for names a worker in
another language runs).

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
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections, transaction

from . import signals
from .errors import CairnQError, LostLease, SerializationError, Snooze
from .ids import ulid
from .records import TaskRecord
from .store.leases import get_leases
from .worker.context import TaskContext
from .worker.envelopes import as_envelope
from .worker.execution import Call
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
    """Runs due tasks in the calling thread; see the module docstring. A context manager."""

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
        self.store = get_leases(using)
        self.inline = inline
        self.retries = retries
        self.raise_exceptions = raise_exceptions
        self.allow_unhandled = allow_unhandled
        self.worker_id = f"worker_test_{ulid()}"
        #: Every attempt run so far, in order.
        self.ran: list[Ran] = []
        # What an inline run raised in an on_commit callback, where Django
        # only logs it (robust=True): raised when the `with` block ends.
        self._deferred_error: Exception | None = None

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
                queues=queues, worker_id=self.worker_id, lease_ms=_LEASE_MS,
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
            unhandled = self.store.fetch(due[:100])
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
        settlement = ctx.settlement
        self._send(signals.task_started, task=row)
        started = time.monotonic()
        exception = None
        try:
            handler = async_to_sync(registration.fn) if registration.is_async else registration.fn
            # Called as the worker calls it: (ctx, payload), or a batch's ([ctx],).
            result = handler(*Call(registration=registration, contexts=[ctx]).args())
        # BaseException, as the worker does: a handler's SystemExit fails its
        # task rather than ending the test run.
        except BaseException as exc:
            exception = exc
            if isinstance(exc, Snooze):
                settlement.snooze(exc.delay_ms, by_worker=True)
            elif not isinstance(exc, LostLease) and not settlement.settled and not ctx.lost_lease:
                envelope, retryable = as_envelope(exc, registration.retries(exc))
                ctx.fail(envelope, retryable=retryable)
        else:
            if not settlement.settled and not ctx.lost_lease:
                if registration.batch is not None:
                    # As the worker: only a {task_id: result} dict gives a batch results.
                    result = result.get(row.id) if isinstance(result, dict) else None
                try:
                    ctx.succeed(result)
                except SerializationError as exc:
                    settlement.fail_unserializable(exc)
        final = settlement.final or self.store.get(row.id) or row
        # The worker's own end-of-task signals, so receivers (and the Tasks
        # framework's task_finished) see a test run as they see a worker's.
        duration = time.monotonic() - started
        if final.status == "succeeded":
            self._send(signals.task_succeeded, task=final, duration=duration)
        elif final.status == "canceled":
            self._send(signals.task_canceled, task=final, duration=duration)
        elif final.status == "queued" and settlement.snoozed_ms is not None:
            self._send(
                signals.task_snoozed, task=final, duration=duration, delay_ms=settlement.snoozed_ms
            )
        elif final.status == "queued":
            self._send(
                signals.task_retrying, task=final, duration=duration, error=final.error,
                delay_ms=settlement.retry_ms or 0,
            )
        elif final.status == "failed":
            signals.send_while_handling(
                lambda: self._send(signals.task_failed, task=final, duration=duration, error=final.error),
                exception,
            )
        attempt = Ran(task=final, exception=exception)
        self.ran.append(attempt)
        return attempt

    def _send(self, signal: Any, **kwargs: Any) -> None:
        signal.send(sender=TaskRunner, worker=self, **kwargs)

    # ------------------------------------------------------------ inline mode
    def __enter__(self) -> TaskRunner:
        """Inline mode: run each task its transaction writes, while the block lasts."""
        if self.inline:
            with _active_lock:
                if not _active:
                    signals.task_written.connect(_on_written, dispatch_uid=__name__)
                _active.insert(0, self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: Any) -> None:
        if not self.inline:
            return
        with _active_lock:
            _active.remove(self)
            if not _active:
                signals.task_written.disconnect(dispatch_uid=__name__)
        if exc_type is None:  # the block's own error goes first
            if self._deferred_error is not None:
                raise self._deferred_error
            self._raise_first(self.ran, None)

    def written(self, rows: list[TaskRecord]) -> None:
        """Called (inline mode) with rows just written: run each once its transaction commits."""
        task_ids = [row.id for row in rows if row.status == "queued"]
        if not task_ids:
            return
        connection = connections[self.store.using]
        if not _in_user_transaction(connection):
            self._run_all(task_ids)
            return

        # A function, not a partial: Django logs a robust callback's error by its __qualname__.
        def run_committed() -> None:
            try:
                self._run_all(task_ids)
            except Exception as exc:
                if self._deferred_error is None:
                    self._deferred_error = exc
                raise  # Django logs it now, where it happened

        # Django drops the callback if its block or savepoint rolls back. Robust,
        # so that it never keeps the caller's own callbacks from running.
        transaction.on_commit(run_committed, using=self.store.using, robust=True)

    def _run_all(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            self.run_until_finished(task_id)


def _in_user_transaction(connection: Any) -> bool:
    """Is an atomic() block open that the test framework did not open itself?"""
    return connection.in_atomic_block and not all(
        getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    )


# The active inline runners, innermost first: the first of a written row's
# alias runs it. The receiver is connected only while there is one.
_active: list[TaskRunner] = []
_active_lock = threading.Lock()


def _on_written(sender: Any, *, using: str, rows: list[TaskRecord], **kwargs: Any) -> None:
    for runner in list(_active):
        if runner.store.using == using:
            runner.written(rows)
            return


# `with run_tasks(...) as tasks:` is the documented spelling of a TaskRunner block.
run_tasks = TaskRunner


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
