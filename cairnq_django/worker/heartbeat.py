"""The heartbeat thread: one lease renewal per beat for every task in flight.

It runs on its own thread with its own database connection, so a handler
that keeps its own thread busy cannot stop it. What can stop it is the GIL: a
C extension that computes without releasing it, or far more busy threads than
CPUs, keeps this thread from waking on time. A beat that comes more than one
interval late is therefore reported (logged, and passed to the ON_ERROR hook
as HeartbeatLate), because a beat later than the lease lets another worker
recover the task and run it a second time. The report names the cause: the
time the previous renewal statement spent in the database (a row lock, the
network) is told apart from a beat that woke late (CPU, GIL).

Nor should the database's own pace hold a beat back. A renewal is soft state
(lost in a crash, a lease just ends sooner), so where the dialect
has_async_commit (PostgreSQL) it commits without waiting for its WAL flush;
a beat under I/O load otherwise waited for the disk on every renewal. And the
rows this worker's settler is committing right now are skipped: their row
locks are held until that group's own flush, and they are about to leave
`running` anyway.

A task missing from a beat's answer has lost its lease, unless this worker is
settling it: a completion that committed while the beat was in flight also
takes the row out of `running`. The context's settling flag, raised before
that write is sent, tells the two apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from django.db import connections, transaction
from django.db.utils import Error as DatabaseError

from ..errors import HeartbeatLate
from ..pooling import release
from ..store import sql
from ..store.leases import LeaseOperations
from ..store.timeouts import bounded_statements
from .connections import statement_timeout_ms
from .context import TaskContext

logger = logging.getLogger("cairnq_django.worker")

# The thread also wakes this often to run `on_tick` (the max-run watchdog).
_TICK_S = 0.25


def heartbeat_interval_ms(lease_ms: int) -> int:
    """Return lease/3 (two beats of slack before expiry), never under 50 ms."""
    return max(50, lease_ms // 3)


class Heartbeat(threading.Thread):
    """Renew the leases of in-flight tasks every lease/3 until stopped."""

    def __init__(
        self,
        *,
        store: LeaseOperations,
        worker_id: str,
        lease_ms: int,
        in_flight: Callable[[], list[TaskContext]],
        report: Callable[..., None],
        on_tick: Callable[[], None] | None = None,
        on_late: Callable[[HeartbeatLate], None] | None = None,
        committing: Callable[[], Collection[str]] | None = None,
        in_flight_since: Callable[[float], list[TaskContext]] | None = None,
    ) -> None:
        super().__init__(name="cairnq-heartbeat", daemon=True)
        self.store = store
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.interval_s = heartbeat_interval_ms(lease_ms) / 1000
        self.in_flight = in_flight
        self.report = report
        self.on_tick = on_tick
        self.on_late = on_late
        # Ids whose completion this worker's settler is writing at the moment.
        self.committing = committing
        # Tasks in flight at any moment after a monotonic time, finished or not.
        self.in_flight_since = in_flight_since
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        with bounded_statements(statement_timeout_ms(self.lease_ms)):
            try:
                due = time.monotonic() + self.interval_s
                renewed_at, previous_renewal_s = 0.0, 0.0
                while not self._stop_event.is_set():
                    self._stop_event.wait(max(0.0, min(due - time.monotonic(), _TICK_S)))
                    now = time.monotonic()
                    if self.on_tick is not None:
                        self._safely(self.on_tick)
                    if now < due:
                        continue
                    late = now - due
                    # The part of the lateness the previous renewal itself spent in
                    # the database: the thread could not wait for `due` while in it.
                    in_renewal = min(late, max(0.0, renewed_at - due))
                    # Renew first: the leases are what is at risk. Then report.
                    at_risk = self._at_risk(due) if late > self.interval_s else None
                    renewal_started = time.monotonic()
                    self._safely(self.beat)
                    renewed_at = time.monotonic()
                    renewal_s = renewed_at - renewal_started
                    release(self.store.using)
                    due = now + self.interval_s
                    if at_risk is not None:
                        self._report_late(late, in_renewal, previous_renewal_s, at_risk)
                    previous_renewal_s = renewal_s
            finally:
                connections.close_all()

    def beat(self) -> None:
        """Renew every live lease in one statement and flag the ones that are gone."""
        live = self._live()
        if live and self.committing is not None:
            committing = self.committing()
            live = [c for c in live if c.task_id not in committing]
        if not live:
            return
        try:
            held = self._renew([c.task_id for c in live])
        except DatabaseError:
            # Reconnect on the next beat instead of reusing a broken connection.
            connections[self.store.using].close()
            raise
        renewed_at = time.monotonic()
        for ctx in live:
            if ctx.task_id in held:
                ctx.settlement.lease_renewed_at = renewed_at
                ctx.settlement.observe_cancel(held[ctx.task_id])
            elif ctx.settlement.mark_lost_unless_settling():
                # Not settled or being settled here: another worker has it.
                logger.warning(
                    "Task %s %s lost its lease (another worker recovered it, or it was "
                    "finished elsewhere); this attempt will write nothing more.",
                    ctx.name, ctx.task_id,
                )

    def _renew(self, task_ids: list[str]) -> dict[str, bool]:
        if not self.store.dialect.has_async_commit:
            # SQLite (WAL, synchronous=NORMAL as recommended) does not sync a commit.
            return self.store.heartbeat_batch(task_ids, self.worker_id, self.lease_ms)
        with transaction.atomic(using=self.store.using):
            with connections[self.store.using].cursor() as cursor:
                cursor.execute(sql.ASYNC_COMMIT)
            return self.store.heartbeat_batch(task_ids, self.worker_id, self.lease_ms)

    def _at_risk(self, due: float) -> list[TaskContext]:
        # A task that finished while this thread was held still went unrenewed
        # past its due beat: its completion may have found the lease expired.
        if self.in_flight_since is None:
            return self._live()
        return [c for c in self.in_flight_since(due) if not c.settlement.lost_lease]

    def _live(self) -> list[TaskContext]:
        return [c for c in self.in_flight() if not c.settlement.settled and not c.settlement.lost_lease]

    def _report_late(
        self, late_s: float, in_renewal_s: float, renewal_s: float, at_risk: list[TaskContext]
    ) -> None:
        tasks = len(at_risk)
        started_late_s = late_s - in_renewal_s
        cause = "database" if in_renewal_s >= started_late_s else "cpu"
        if cause == "database":
            logger.warning(
                "The heartbeat ran %d ms late (interval %d ms, lease %d ms) because its previous "
                "lease renewal took %d ms in the database or on the network: a row lock held by "
                "another session, a slow or broken network path, or an overloaded server (the "
                "beat itself started %d ms late). The leases of %d in-flight task(s) are at "
                "risk: a beat later than the lease lets another worker run the same task again.",
                late_s * 1000, self.interval_s * 1000, self.lease_ms, renewal_s * 1000,
                started_late_s * 1000, tasks,
            )
        else:
            logger.warning(
                "The heartbeat ran %d ms late (interval %d ms, lease %d ms): the beat itself "
                "started late, so something held the GIL or starved this worker of CPU: a "
                "handler calling a C extension that does not release the GIL, or more busy "
                "threads than the machine has cores. The leases of %d in-flight task(s) are "
                "at risk: a beat later than the lease lets another worker run the same task "
                "again. Move such work to a subprocess, lower --concurrency, or raise --lease.",
                late_s * 1000, self.interval_s * 1000, self.lease_ms, tasks,
            )
        if self.on_late is None:
            return
        late = HeartbeatLate(
            late_ms=round(late_s * 1000),
            interval_ms=round(self.interval_s * 1000),
            lease_ms=self.lease_ms,
            task_ids=[c.task_id for c in at_risk],
            cause=cause,
            renewal_ms=round(renewal_s * 1000),
            started_late_ms=round(started_late_s * 1000),
        )
        try:
            self.on_late(late)
        except Exception:
            logger.exception("Reporting a late heartbeat failed; ignoring it.")

    def _safely(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            self.report(exc, phase="heartbeat")
