"""Running one handler call and settling the tasks it was given.

A call is one invocation of a handler: one task, or a list of tasks for a
name registered with `batch=`. When the call ends, every task it did not settle
itself is settled by how it ended: a return completes them (a batch may return
{task_id: result}), a raise fails them (a TaskError as it says, anything else
retryably with backoff) except a Snooze, which snoozes them. A call the worker
gives up on (it ran past max-run, or the worker is shutting down) is
abandoned: its contexts are flagged lease-lost first, so the handler can no
longer write, then its tasks fail retryably.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import close_old_connections

from .. import signals
from ..errors import LostLease, SerializationError, Snooze
from ..pooling import release_all
from ..records import TaskRecord, attempt_label
from ..store.encoding import encode_result
from ..store.leases import LeaseOperations
from .context import TaskContext, run_on_db
from .envelopes import as_envelope
from .registry import Registration
from .step_context import StepContext

logger = logging.getLogger("cairnq_django.worker")


# Settler.complete_later: (task_id, worker_id, encoded result, then(row, error)) -> queued.
CompleteLater = Callable[
    [str, str, str | None, Callable[[TaskRecord | None, BaseException | None], None]], bool
]


@dataclass(eq=False)
class Call:
    """One handler invocation in flight."""

    registration: Registration
    contexts: list[TaskContext]
    started: float = field(default_factory=time.monotonic)
    deadline: float | None = None
    thread: threading.Thread | None = None
    future: Any = None  # concurrent.futures.Future of an async call
    abandoned: bool = False
    returned: bool = False  # the handler is done; its tasks may still be settling
    released: bool = False

    @property
    def name(self) -> str:
        return self.registration.name

    @property
    def batched(self) -> bool:
        return self.registration.batch is not None

    def args(self) -> tuple[Any, ...]:
        if self.batched:
            return (self.contexts,)
        ctx = self.contexts[0]
        return (ctx, ctx.payload)


class Execution:
    """Runs calls and settles their tasks on behalf of one Worker."""

    def __init__(
        self,
        *,
        worker: Any,
        store: LeaseOperations,
        on_done: Callable[[Call], None],
        report: Callable[..., None],
        write_completion: Callable[[str, str, Any], TaskRecord] | None = None,
        on_returned: Callable[[Call], None] | None = None,
        complete_later: CompleteLater | None = None,
    ) -> None:
        self.worker = worker
        self.store = store
        self.on_done = on_done
        self.report = report
        # The worker passes its Settler's group commit; alone, one write a task.
        self.write_completion = write_completion or store.complete
        self.on_returned = on_returned or (lambda call: None)
        # The Settler's complete_later: a sync call that returned hands its
        # completion over and its thread moves on (see _complete_later).
        self.complete_later = complete_later

    # ------------------------------------------------------------ running
    def run_sync(self, call: Call) -> None:
        """Run a sync handler call on the current (handler) thread, then settle."""
        call.thread = threading.current_thread()
        if call.abandoned:  # given up on before a thread was free to start it
            self.on_done(call)
            return
        close_old_connections()
        handed_over = False
        try:
            self.started(call)
            try:
                result = call.registration.fn(*call.args())
            except BaseException as exc:  # SystemExit in a handler fails the task, not the thread
                self.on_returned(call)
                # The settle may wait for the settler's connection: a pool
                # slot held here meanwhile could be the one it waits for.
                release_all()
                self.finish_raised(call, exc)
            else:
                self.on_returned(call)
                release_all()
                handed_over = self._complete_later(call, result)
                if not handed_over:
                    self.finish_returned(call, result)
        except Exception as exc:  # a settle that failed: already logged per task
            self.report(exc, phase="execute", task=call.name)
        finally:
            close_old_connections()
            if not handed_over:
                self.on_done(call)

    async def run_async(self, call: Call, db_executor: Any) -> None:
        """Run an async handler call on the event loop; database work goes to threads."""
        on_db = partial(run_on_db, db_executor)
        try:
            await on_db(partial(self.started, call))
            try:
                result = await call.registration.fn(*call.args())
            except asyncio.CancelledError:
                if not call.abandoned:
                    raise
                return  # abandoned: the worker has already settled its tasks
            except BaseException as exc:
                self.on_returned(call)
                await on_db(partial(self.finish_raised, call, exc))
            else:
                self.on_returned(call)
                await on_db(partial(self.finish_returned, call, result))
        except Exception as exc:  # a CancelledError is no Exception: it propagates
            self.report(exc, phase="execute", task=call.name)
        finally:
            self.on_done(call)

    # ------------------------------------------------------------ settling
    def finish_returned(self, call: Call, result: Any) -> None:
        """Complete every task the call left unsettled."""
        results = result if call.batched and isinstance(result, dict) else None
        for ctx in call.contexts:
            value = (results or {}).get(ctx.task_id) if call.batched else result
            self._guarded(ctx, partial(self._complete, ctx, value))
        self.ended(call)

    def _complete_later(self, call: Call, result: Any) -> bool:
        """Hand a returned one-task call's completion to the settler; whether it was taken.

        The handler thread then moves on instead of sleeping until the group
        commits and being woken again: the settler thread, once the row is
        written, settles the context, reports the end and releases the call
        (_completed_later), in the order finish_returned and run_sync would.
        Not taken (the usual path follows) for a batch, a task already
        settled or lost, a result that cannot be stored, or a stopping settler.
        """
        if self.complete_later is None or call.batched or len(call.contexts) != 1:
            return False
        ctx = call.contexts[0]
        if isinstance(ctx, StepContext):
            return False  # its release shares its completion's transaction: written alone
        try:
            encoded = encode_result(result)
        except SerializationError:
            return False  # the usual path's complete fails the task for it
        if not ctx.settlement.begin_completion():
            return False
        then = partial(self._completed_later, call, ctx)
        if not self.complete_later(ctx.task_id, ctx.worker_id, encoded, then):
            ctx.settlement.end_completion(None)  # nothing was written: the usual path writes it
            return False
        return True

    def _completed_later(
        self, call: Call, ctx: TaskContext, row: TaskRecord | None, error: BaseException | None,
    ) -> None:
        """On the settler thread: the outcome of a completion _complete_later handed over.

        A lost connection was already retried by the settler while the lease lasted.
        """
        try:
            lost = isinstance(error, LostLease)
            ctx.settlement.end_completion(row, lost=lost)
            if error is not None and not lost:
                # Left running: lease recovery settles it if this worker cannot.
                self.report(error, phase="settle", task=ctx.name, task_id=ctx.task_id)
            self.ended(call)
        except Exception as exc:
            self.report(exc, phase="execute", task=call.name)
        self.on_done(call)

    def finish_raised(self, call: Call, exc: BaseException) -> None:
        """Fail every task the call left unsettled, as the exception says (Snooze snoozes them)."""
        if isinstance(exc, Snooze):
            for ctx in call.contexts:
                self._guarded(ctx, partial(ctx.settlement.snooze, exc.delay_ms, by_worker=True))
        elif not isinstance(exc, LostLease):
            envelope, retryable = as_envelope(exc, call.registration.retries(exc))
            for ctx in call.contexts:
                self._guarded(ctx, partial(ctx.settlement.fail, envelope, retryable, by_worker=True))
        self.ended(call, raised=exc)

    def abandon(self, call: Call, envelope: dict[str, Any], *, delay_ms: int | None) -> None:
        """Take the call's tasks away from its handler and fail them retryably.

        `delay_ms=None` applies the usual backoff; shutdown passes 0 so the
        tasks are claimable again at once rather than after a full lease.
        """
        call.abandoned = True
        for ctx in call.contexts:
            try:
                ctx.settlement.abandon(envelope, delay_ms=delay_ms)
            except LostLease:
                continue
            except Exception as exc:
                self.report(exc, phase="abandon", task=ctx.name, task_id=ctx.task_id)
        self.ended(call)

    def _guarded(self, ctx: TaskContext, settle: Callable[[], object]) -> None:
        try:
            settle()
        except LostLease:
            ctx.settlement.mark_lost_lease()
        except Exception as exc:
            # Left running: lease recovery settles it if this worker cannot.
            self.report(exc, phase="settle", task=ctx.name, task_id=ctx.task_id)

    def _complete(self, ctx: TaskContext, value: Any) -> None:
        # A step's completion is written alone, with its release (never in a group).
        write = ctx.settlement.store.complete if isinstance(ctx, StepContext) else self.write_completion
        ctx.settlement.complete(lambda: write(ctx.task_id, ctx.worker_id, value), by_worker=True)

    # ------------------------------------------------------------ reporting
    def started(self, call: Call) -> None:
        # Per task, so the disabled log line and the signal nobody receives
        # are skipped before any of their arguments are built.
        log = logger.isEnabledFor(logging.INFO)
        listened = bool(signals.task_started.receivers)
        if not (log or listened):
            return
        for ctx in call.contexts:
            if log:
                logger.info(
                    "Task %s %s attempt %s started.",
                    ctx.name, ctx.task_id, attempt_label(ctx.attempt, ctx.max_attempts),
                )
            if listened:
                self.send(signals.task_started, task=ctx.record)

    def ended(self, call: Call, raised: BaseException | None = None) -> None:
        """Log one end line per task and send its signal, once per task."""
        duration = time.monotonic() - call.started
        for ctx in call.contexts:
            if ctx.settlement.mark_ended():
                self._end_one(ctx, duration, raised)

    def _end_one(self, ctx: TaskContext, duration: float, raised: BaseException | None) -> None:
        settlement = ctx.settlement
        row = settlement.final
        if row is not None and row.status == "succeeded":
            # The common end: its line and message built only if it is logged.
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "Task %s %s attempt %s succeeded in %.3fs.", ctx.name, ctx.task_id,
                    attempt_label(ctx.attempt, ctx.max_attempts), duration,
                )
            self.send(signals.task_succeeded, task=row, duration=duration)
            return
        where = f"Task {ctx.name} {ctx.task_id} attempt {attempt_label(ctx.attempt, ctx.max_attempts)}"
        if row is None:
            logger.warning(
                "%s lost its lease after %.3fs; another worker owns it now and "
                "nothing more was written for this attempt.", where, duration,
            )
            self.send(signals.task_lease_lost, task=ctx.record, duration=duration)
            return
        error = row.error
        why = describe_error(error)
        if row.status == "canceled":
            logger.info("%s canceled in %.3fs.", where, duration)
            self.send(signals.task_canceled, task=row, duration=duration)
        elif row.status == "queued" and settlement.snoozed_ms is not None:
            logger.info("%s snoozed for %d ms after %.3fs.", where, settlement.snoozed_ms, duration)
            self.send(signals.task_snoozed, task=row, duration=duration, delay_ms=settlement.snoozed_ms)
        elif row.status == "queued":
            delay = settlement.retry_ms or 0
            logger.info(
                "%s failed (%s) in %.3fs; retrying in %d ms.", where, why, duration, delay
            )
            self.send(
                signals.task_retrying, task=row, duration=duration, error=error, delay_ms=delay
            )
        else:
            code = error.get("code") if isinstance(error, dict) else None
            retryable = isinstance(error, dict) and error.get("retryable") is True
            logger.warning(
                "%s failed (%s) in %.3fs; %s.", where, why, duration,
                "no attempt left" if retryable else "not retryable, so final",
                # The traceback of an unexpected exception, once, when it is final.
                exc_info=raised if code == "handler_error" else None,
            )
            signals.send_while_handling(
                partial(self.send, signals.task_failed, task=row, duration=duration, error=error),
                raised,
            )

    def send(self, signal: Any, **kwargs: Any) -> None:
        """Send a worker signal; a receiver that raises is logged, never fatal."""
        if not signal.receivers:
            return  # nobody listens: skip building the send's arguments and lists
        for receiver, response in signal.send_robust(
            sender=type(self.worker), worker=self.worker, **kwargs
        ):
            if isinstance(response, Exception):
                logger.error(
                    "A receiver of a cairnq_django signal (%r) raised; the task is "
                    "unaffected.", receiver, exc_info=response,
                )


# A log line stays one line: longer messages are cut (the row keeps them whole).
_MESSAGE_CHARS = 300


def describe_error(error: Any) -> str:
    """"handler_error: ConnectionError: upstream timed out" for an error envelope.

    Code, type and the message's first line: what an operator needs to tell
    one failure from another without opening the row.
    """
    if not isinstance(error, dict):
        return str(error)
    lines = str(error.get("message") or "").strip().splitlines()
    message = lines[0] if lines else ""
    if len(message) > _MESSAGE_CHARS:
        message = message[: _MESSAGE_CHARS - 1] + "…"
    if len(lines) > 1:
        message += " …"
    parts = [str(error.get("code")), str(error.get("type"))]
    return ": ".join([*parts, message] if message else parts)
