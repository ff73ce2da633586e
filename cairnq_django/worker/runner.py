"""The Worker: claim due tasks for the registered names, dispatch them, and shut down.

The loop asks a read-only question first (is anything claimable?) and only
then opens the one short write transaction that recovers expired leases and
claims. No transaction is held while a handler runs. What each claim asks for
is planned in planner.py, when to look again and how to wait until then is
idle.py, the calls it starts are counted in inflight.py, and the worker's
configuration is options.py. The threads the worker starts and their
shutdown order are here, to be read together.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from typing import TYPE_CHECKING, Any, Unpack

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from .. import signals
from ..conf import cairnq_settings
from ..drained import announcement
from ..errors import HeartbeatLate, ProtocolVersionMismatch
from ..ids import ulid
from ..records import Limit, TaskRecord
from ..store.leases import get_leases
from ..store.timeouts import bounded_statements
from ..tables import check_tables
from ..workflows import STEP_KEY
from .connections import WorkerConnectionPolicy, statement_timeout_ms
from .context import TaskContext
from .envelopes import shutdown_envelope, timeout_envelope
from .execution import Call, Execution
from .heartbeat import Heartbeat
from .idle import SLICE_S, IdlePolicy
from .inflight import InFlight
from .limits import LimitsCache
from .options import WorkerOptions, WorkerOverrides, framework_backend_queues
from .planner import (
    Rotation,
    any_draw_filled,
    build_sources,
    free_calls,
    plan_draws,
    select_handlers,
    served_queues,
    split_calls,
)
from .poison import fail_undecodable
from .pools import EventLoopThread, HandlerThreads
from .registry import Registration, Registry, autodiscover
from .registry import registry as default_registry
from .settler import Settler
from .step_context import StepContext
from .upkeep import TableUpkeep

if TYPE_CHECKING:
    from ..observability.presence import Presence
    from ..schedules.scheduler import Scheduler

logger = logging.getLogger("cairnq_django.worker")

# How often the claim loop refreshes planner statistics where the database
# needs it (SQLite's PRAGMA optimize), besides once at start.
_STATISTICS_EVERY_S = 3600.0


class Worker:
    """Run the registered handlers for tasks in the configured queues until stopped.

    `Worker(options)` takes a WorkerOptions; `Worker(concurrency=4, ...)` builds
    one from settings with those overrides (WorkerOptions.from_settings).
    `registry` defaults to the process-wide one, autodiscovered unless
    `discover=False`.
    """

    def __init__(
        self,
        options: WorkerOptions | None = None,
        *,
        registry: Registry | None = None,
        discover: bool = True,
        **overrides: Unpack[WorkerOverrides],
    ) -> None:
        if options is None:
            options = WorkerOptions.from_settings(**overrides)
        elif overrides:
            raise TypeError("Pass a WorkerOptions or option overrides, not both.")
        self.options = options
        if discover and registry is None:
            autodiscover()
        self.registry = registry or default_registry
        self.using = options.using
        self.store = get_leases(self.using)
        # Enqueue the occurrences of CAIRNQ['SCHEDULE'] (not in burst mode).
        self.run_scheduler = options.scheduler and not options.burst
        self.handlers = select_handlers(self.registry.handlers, options.names)
        self.queues = served_queues(
            options.queues, cairnq_settings.QUEUES, self.handlers, framework_backend_queues()
        )
        self.worker_id = f"worker_{ulid()}"
        self._rotation = Rotation(build_sources(self.handlers))
        # Fleet-wide flow limits (flow/limits.py), re-read about once a second.
        self._limits = LimitsCache(self.using)

        self._in_flight = InFlight()
        self._changed = self._in_flight.changed
        self._stopping = False
        self._signals_seen = 0
        # Where the database takes one writer at a time (SQLite), the claim loop
        # and the settler take turns at its write lock through this gate:
        # SQLite's own busy handler would make them sleep for milliseconds.
        # Row-locking databases need none.
        self._write_gate: AbstractContextManager[Any] = (
            threading.Lock() if self.store.dialect.serializes_writes else nullcontext()
        )
        self.settler = Settler(
            self.store, write_gate=self._write_gate,
            statement_timeout_ms=statement_timeout_ms(self.options.lease_ms),
            lease_expired_by=self._in_flight.lease_expired_by, lease_ms=self.options.lease_ms,
        )
        # PostgreSQL: VACUUM the queue table after enough claims (upkeep.py says why).
        self._upkeep = TableUpkeep(self.store, self.report)
        self.execution = Execution(
            worker=self, store=self.store, on_done=self._in_flight.release, report=self.report,
            write_completion=self.settler.complete, on_returned=self._in_flight.returned,
            complete_later=self.settler.complete_later,
        )
        self._threads: HandlerThreads | None = None
        self._loop_thread: EventLoopThread | None = None
        self._heartbeat: Heartbeat | None = None
        self._scheduler: Scheduler | None = None
        # When to look again and how to wait until then (idle.py).
        self._idle = IdlePolicy(
            worker_id=self.worker_id, store=self.store, queues=self.queues,
            names=sorted(self.handlers),
            poll_ms=options.poll_ms, burst=options.burst,
            in_flight=self._in_flight, stopping=lambda: self._stopping,
            refresh_presence=self._refresh_presence, report=self.report,
        )
        self._presence: Presence | None = None
        self._connection_policy = WorkerConnectionPolicy()

    @property
    def concurrency(self) -> int:
        return self.options.concurrency

    @property
    def shutdown_timeout_ms(self) -> int:
        return self.options.shutdown_timeout_ms

    @property
    def tasks_started(self) -> int:
        return self._in_flight.tasks_started

    # ------------------------------------------------------------ reporting
    def report(self, exc: BaseException, **context: Any) -> None:
        """Log an error the worker survived and pass it to the ON_ERROR hook."""
        context.setdefault("worker_id", self.worker_id)
        logger.error(
            "The worker recovered from an error (%s): %s",
            ", ".join(f"{k}={v}" for k, v in context.items()), exc,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        self._call_on_error(exc, context)

    def _report_late_heartbeat(self, late: HeartbeatLate) -> None:
        """Pass a late heartbeat to the ON_ERROR hook; the heartbeat has logged it."""
        self._call_on_error(
            late, {"phase": "execute", "worker_id": self.worker_id, "task_ids": late.task_ids}
        )
        self.execution.send(signals.heartbeat_late, error=late)

    def _call_on_error(self, exc: BaseException, context: dict[str, Any]) -> None:
        if self.options.on_error is None:
            return
        try:
            self.options.on_error(exc, dict(context))
        except Exception:
            logger.exception("The CAIRNQ['ON_ERROR'] hook raised; ignoring it.")

    # ------------------------------------------------------------ control
    def stop(self) -> None:
        """Stop claiming; run() then drains in-flight calls and returns."""
        self._stopping = True
        self._changed.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the worker gracefully; a second one exits at once."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.handle_signal)

    def handle_signal(self, signum: int, frame: Any) -> None:
        """What SIGTERM/SIGINT do: the first stops gracefully, a second exits at once.

        A signal handler itself, or called by one (reloading.py's, on the main thread).
        """
        self._signals_seen += 1
        name = signal.Signals(signum).name
        if self._signals_seen > 1:
            logger.warning("Received %s again; exiting now without waiting.", name)
            for handler in logging.getLogger().handlers + logger.handlers:
                with suppress(Exception):
                    handler.flush()
            sys.stderr.flush()
            os._exit(1)
        # Only a flag here: a signal handler must not take locks the
        # interrupted code may hold. The loop waits in short slices.
        self._stopping = True
        logger.warning(
            "Received %s; no new tasks will be claimed. Waiting up to %d ms for %d running "
            "call(s); send it again to exit at once.",
            name, self.shutdown_timeout_ms, len(self._in_flight),
        )

    # ------------------------------------------------------------ running
    def run(self, *, after_first_poll: Callable[[], None] | None = None) -> None:
        """Claim and run tasks until stopped (or, with burst, until none is claimable).

        Raises TablesMissing, before starting anything or once a claim fails,
        when the database's catalog shows `migrate` has not created the tables:
        unlike a database that is restarting, that does not heal by waiting.

        `after_first_poll` is called once, on this thread, right after the
        first poll (whether it claimed or not): work the first claim need not
        wait for (cairnq_worker's web-facing system checks). An exception it
        raises stops the worker as stop() does, running calls finishing, and
        run() then raises it.
        """
        check_tables(self.using)
        # Opened before _start() applies the worker's connection lifetime.
        _close_connection(self.using)
        self._start()
        try:
            with bounded_statements(statement_timeout_ms(self.options.lease_ms)):
                self._loop(after_first_poll)
        finally:
            self._shutdown()

    def _start(self) -> None:
        options = self.options
        self._connection_policy.apply()
        if not self.handlers:
            logger.warning(
                "No task handlers are registered; this worker will claim nothing. Register "
                "handlers with @cairnq_django.task in an installed app's tasks.py."
            )
        logger.info(
            "cairnq worker %s starting on database %r (%s): queues %s; handlers %s; "
            "concurrency %d; lease %d ms; poll %d ms; max-run %s; pid %d on %s.",
            self.worker_id, self.using, self.store.dialect.vendor,
            ", ".join(self.queues), ", ".join(sorted(self.handlers)) or "(none)",
            options.concurrency, options.lease_ms, options.poll_ms,
            f"{options.max_run_ms} ms" if options.max_run_ms else "none",
            os.getpid(), socket.gethostname(),
        )
        self.settler.start()
        # A thread per running call plus one per call waiting on its settle.
        self._threads = HandlerThreads(2 * options.concurrency)
        if any(not reg.is_async for reg in self.handlers.values()):
            self._threads.start()
        if any(reg.is_async for reg in self.handlers.values()):
            self._loop_thread = EventLoopThread(2 * options.concurrency)
            self._loop_thread.start()
        self._heartbeat = Heartbeat(
            store=self.store, worker_id=self.worker_id, lease_ms=options.lease_ms,
            in_flight=self._in_flight.contexts, report=self.report, on_tick=self._watchdog,
            on_late=self._report_late_heartbeat, committing=self.settler.committing,
            in_flight_since=self._in_flight.contexts_since,
        )
        self._heartbeat.start()
        self._start_presence()
        if self.run_scheduler:
            self._start_scheduler()
        self._idle.start()

    def _loop(self, after_first_poll: Callable[[], None] | None) -> None:
        options = self.options
        refresh_at = 0.0
        # The workers-table row is first written after the first poll (see
        # _start_presence), then on every turn.
        polled = False
        while not self._stopping:
            if polled:
                self._refresh_presence()
            if self.store.dialect.needs_periodic_analyze and time.monotonic() >= refresh_at:
                refresh_at = time.monotonic() + _STATISTICS_EVERY_S
                self._refresh_statistics()
            # Cleared before looking, so a call finishing after this point is seen.
            self._changed.clear()
            # The calls in flight that are not running wait for their completion.
            busy, running = self._in_flight.counts()
            free = free_calls(options.concurrency, running, busy)
            if free <= 0:
                self._idle.full()
                continue
            try:
                claimed = self._poll(free)
            except ProtocolVersionMismatch:
                raise  # never run against a database speaking another protocol
            except ImproperlyConfigured as exc:
                # Settings the worker cannot run with: retrying changes nothing.
                logger.critical("The worker cannot run with these settings; stopping: %s", exc)
                raise
            except Exception as exc:
                _close_connection(self.using)
                check_tables(self.using)  # the one failure that waiting cannot heal
                self.report(exc, phase="claim")
                self._idle.claim_failed()
                continue
            if not polled:
                polled = True
                if after_first_poll is not None:
                    after_first_poll()
                self._refresh_presence()
            if not self._idle.rest(claimed, busy):
                logger.info("Burst mode: nothing left to claim; stopping.")
                return

    def _refresh_statistics(self) -> None:
        """Keep the planner's statistics fresh (without them SQLite skips the lease index)."""
        try:
            with self._write_gate:
                self.store.refresh_statistics()
        except Exception as exc:  # stale statistics cost speed, never correctness
            self.report(exc, phase="statistics")

    def _poll(self, free: int) -> int:
        """Probe, then claim up to `free` calls' worth of tasks; return calls started."""
        if not self.handlers:
            return 0
        turn = self._idle.begin_poll()
        if turn is None:
            return 0
        limits = self._limits.current()
        pending = self._rotation.next_order()
        started = 0
        filled = False
        while free > 0 and pending:
            draws = plan_draws(
                pending, free, concurrency=self.options.concurrency,
                calls_by_name=self._in_flight.calls_by_name(),
            )
            if not draws:
                break
            drawn = [d.source for d in draws]
            # Only a claim covering every name can tell the fleet it took all there was.
            announce = len(drawn) == len(pending) and self._idle.announces(turn)
            with self._write_gate:
                rows = self._claim(draws, announce=announce, limits=limits)
            self._upkeep.claimed(len(rows))
            filled = filled or any_draw_filled(draws, rows)
            pending = [s for s in pending if s not in drawn]
            calls = self._calls(fail_undecodable(rows, self._fail_unrun, self.report))
            for call in calls:
                self._dispatch(call)
            started += len(calls)
            free -= len(calls)
        self._idle.end_poll(turn, started, filled=filled, pending=bool(pending))
        return started

    def _claim(self, draws: list[Any], *, announce: bool, limits: list[Limit]) -> list[TaskRecord]:
        """One claim transaction; with `announce`, it tells the fleet if it left nothing behind.

        Under flow limits it is the limited claim (store/limited_claim.py),
        which also says whether they held anything back; with none, the
        plain claim, unchanged.
        """
        draw_plan: list[tuple[Sequence[str] | None, int]] = [
            (list(d.source.names), d.limit) for d in draws
        ]
        announced = (
            (announcement(self._idle.drained_key, self.worker_id), sorted(self.handlers))
            if announce else None
        )
        if not limits:
            return self.store.claim(
                queues=self.queues, worker_id=self.worker_id, lease_ms=self.options.lease_ms,
                draws=draw_plan, announce=announced,
            )
        result = self.store.claim_limited(
            limits=limits, queues=self.queues, worker_id=self.worker_id,
            lease_ms=self.options.lease_ms, draws=draw_plan, announce=announced,
        )
        if result.held:
            self._idle.held_back(result.retry_in_ms)
        return result.tasks

    def _fail_unrun(self, task: TaskRecord, envelope: dict[str, Any]) -> None:
        with self._write_gate:
            self.store.fail(
                task.id, self.worker_id, envelope, retryable=False, started_at_ms=task.updated_at_ms
            )

    def _calls(self, rows: list[TaskRecord]) -> list[Call]:
        max_run_ms = self.options.max_run_ms
        deadline = time.monotonic() + max_run_ms / 1000 if max_run_ms else None
        return [
            Call(
                registration=reg,
                contexts=[self._context(task, reg) for task in tasks],
                deadline=deadline,
            )
            for reg, tasks in split_calls(rows, self.handlers)
        ]

    def _context(self, task: TaskRecord, registration: Registration) -> TaskContext:
        # One dict lookup: a plain task keeps the plain context and the group commit.
        metadata = task.metadata
        kind = StepContext if type(metadata) is dict and STEP_KEY in metadata else TaskContext
        base_ms, cap_ms = registration.retry_backoff_ms or (
            self.options.retry_backoff_base_ms, self.options.retry_backoff_cap_ms
        )
        return kind(
            store=self.store, task=task, worker_id=self.worker_id, lease_ms=self.options.lease_ms,
            retry_backoff_base_ms=base_ms, retry_backoff_cap_ms=cap_ms,
            db_executor=self._loop_thread.db_executor if self._loop_thread else None,
        )

    def _dispatch(self, call: Call) -> None:
        self._in_flight.add(call)
        if call.registration.is_async:
            assert self._loop_thread is not None  # noqa: S101 - run() starts it when a handler is async
            call.future = self._loop_thread.submit(
                self.execution.run_async(call, self._loop_thread.db_executor)
            )
        else:
            assert self._threads is not None  # noqa: S101 - started in run(), before any dispatch
            self._threads.submit(lambda: self.execution.run_sync(call))

    # ------------------------------------------------------------ abandoning
    def _watchdog(self) -> None:
        """Abandon calls that outran max-run (runs on the heartbeat thread)."""
        max_run_ms = self.options.max_run_ms
        if not max_run_ms:
            return
        for call in self._in_flight.overdue(time.monotonic()):
            logger.warning(
                "The handler for %s ran longer than max-run (%d ms); abandoning it: %s.",
                call.name, max_run_ms, ", ".join(c.task_id for c in call.contexts),
            )
            self._abandon(call, timeout_envelope(call.name, max_run_ms), delay_ms=None)

    def _abandon(self, call: Call, envelope: dict[str, Any], *, delay_ms: int | None) -> None:
        self.execution.abandon(call, envelope, delay_ms=delay_ms)
        if call.future is not None:
            call.future.cancel()
        elif self._threads is not None:
            self._threads.retire(call.thread)
        self._in_flight.release(call)

    # ------------------------------------------------------------ schedules
    def _start_scheduler(self) -> None:
        from ..schedules.scheduler import Scheduler

        try:
            scheduler = Scheduler(
                using=self.using, write_gate=self._write_gate, report=self.report
            )
        except Exception as exc:
            self.report(exc, phase="schedule")
            return
        if scheduler.schedules:
            self._scheduler = scheduler
            scheduler.start()

    # ------------------------------------------------------------ presence
    def _start_presence(self) -> None:
        """Record this worker in the workers table, refreshed by the loop (cairnq_status shows it).

        The row is written by the loop once its first poll has claimed (or
        found nothing), not here: the write, its cleanup of long-gone rows and
        the unhandled-name check are a transaction of several statements that
        only observers read, and a worker's start-up is counted to its first
        claim. The row is as late as one claim; a worker whose first poll
        fails writes it once a poll succeeds.
        """
        from ..observability.presence import Presence

        self._presence = Presence(
            worker=self, interval_ms=cairnq_settings.WORKER_REPORT_INTERVAL,
            running=lambda: len(self._in_flight.contexts()), report=self.report,
        )

    def _refresh_presence(self) -> None:
        """On the loop's own session: no extra connection per worker for a write every 10 s."""
        if self._presence is not None and time.monotonic() >= self._presence.due_at:
            with self._write_gate:
                self._presence.tick()

    # ------------------------------------------------------------ shutdown
    def _shutdown(self) -> None:
        timeout_ms = self.options.shutdown_timeout_ms
        deadline = time.monotonic() + timeout_ms / 1000
        if self._in_flight:
            logger.info(
                "Waiting up to %d ms for %d running call(s).", timeout_ms, len(self._in_flight)
            )
        while self._in_flight and time.monotonic() < deadline:
            self._changed.clear()
            self._changed.wait(min(SLICE_S, max(0.0, deadline - time.monotonic())))
        for call in self._in_flight.calls():
            logger.warning(
                "Abandoning %s (%s) at shutdown; it is requeued for another worker now.",
                call.name, ", ".join(c.task_id for c in call.contexts),
            )
            try:
                self._abandon(call, shutdown_envelope(call.name), delay_ms=0)
            except Exception as exc:
                self.report(exc, phase="shutdown")
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat.join(5)
        if self._scheduler is not None:
            self._scheduler.stop(timeout=5)
        if self._threads is not None:
            self._threads.stop()
        if self._loop_thread is not None:
            self._loop_thread.stop()
        self.settler.stop()
        self._upkeep.join(5)
        if self._presence is not None:
            with self._write_gate:
                self._presence.stop()  # deletes this worker's row
        self._idle.close()
        _close_connection(self.using)
        self._connection_policy.restore()
        logger.info(
            "cairnq worker %s stopped after starting %d task(s).",
            self.worker_id, self.tasks_started,
        )


def _close_connection(using: str) -> None:
    with suppress(Exception):
        connections[using].close()

