"""The PostgreSQL wakeup: LISTEN cairnq_queued / cairnq_done on a connection of its own.

The schema's trigger (and every peer writing the tables) sends the
notifications; one listener thread per process and alias turns them into
wakes for the threads and coroutines waiting on this process's side.
CAIRNQ['LISTEN_DATABASE'] may point the listener elsewhere than the queue's
alias (past a transaction-mode PgBouncer, which cannot deliver notifications);
probe.py checks, at every connect, that notifications arrive at all.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from typing import Any

from django.db import connections

from ..conf import cairnq_settings
from ..connection_options import connection_options
from ..drained import DRAINED_CHANNEL, parse_announcement
from ..records import DONE_CHANNEL, QUEUED_CHANNEL
from ..store import sql
from .base import RECONNECT_INITIAL_S, RECONNECT_MAX_S, Waits
from .probe import PROBE_CHANNEL, DeliveryProbe, describe
from .seats import SeatBook, give_up_seat, take_seat

logger = logging.getLogger("cairnq_django.wakeup")

# Distinct announcers remembered per key: two already prove a worker has peers.
_SENDERS_KEPT = 8


# How often the listener stops waiting to check for close() and the probe.
LISTEN_SLICE_S = 0.25
# How many finished task ids are remembered for a waiter that registers just
# after the notification arrived.
RECENT_DONE_LIMIT = 1024


def postgres_params(alias: str) -> dict[str, Any]:
    """The connection parameters of `alias`, for a bare psycopg LISTEN connection."""
    # CairnQ's TCP options under the alias's own: a LISTEN connection is idle
    # by nature, and without keepalives a dead one is never noticed.
    params = {**connection_options(), **connections[alias].get_connection_params()}
    # Django's cursor class and pool options mean nothing to a bare LISTEN connection.
    for key in ("cursor_factory", "pool"):
        params.pop(key, None)
    params.setdefault("application_name", "cairnq_django wakeup")
    return params


def listen_params(alias: str) -> dict[str, Any]:
    """Where `alias`'s listener connects: the alias itself, or CAIRNQ['LISTEN_DATABASE'].

    That setting is another DATABASES alias, or a libpq connection string whose
    parameters replace the alias's own (so 'host=db port=5432' keeps the
    database name, user and password and only bypasses the pooler).
    """
    target = cairnq_settings.LISTEN_DATABASE
    if not target:
        return postgres_params(alias)
    if target in connections.settings:
        return postgres_params(target)
    from psycopg.conninfo import conninfo_to_dict

    return {**postgres_params(alias), **conninfo_to_dict(target)}


def send_probe(alias: str, token: str) -> None:
    """NOTIFY the probe channel through `alias`'s Django connection, as enqueues do.

    On a pooled alias that borrows a pool slot rather than opening a session
    of its own; either way the connection is given back at once.
    """
    connection = connections[alias]
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql.NOTIFY, [PROBE_CHANNEL, token])
    finally:
        connection.close()


class PostgresWakeup(Waits):
    """LISTEN cairnq_queued / cairnq_done on a dedicated autocommit connection.

    With `probe_alias` (the queue's alias) each connect is followed by a
    delivery probe (probe.py) sent through that alias. With `seats`, workers
    that seek_seat() share that many listening seats per key (seats.py);
    None: every worker hears every wake.
    """

    def __init__(
        self, conn_params: dict[str, Any], *, probe_alias: str | None = None,
        seats: int | None = None,
    ) -> None:
        super().__init__()
        self._params = conn_params
        self._seats = seats or 0
        self._book = SeatBook()
        # Channels the current session LISTENs (none while there is no session).
        self._channels: set[str] = set()
        # Wakes the listener out of its wait when a worker's seat wish changes.
        self._poke_r, self._poke_w = socket.socketpair()
        self._poke_r.setblocking(False)
        self._poke_w.setblocking(False)
        self._probe: DeliveryProbe | None = None
        if probe_alias is not None:
            self._probe = DeliveryProbe(
                probe_alias, describe(conn_params), partial(send_probe, probe_alias)
            )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listening = False
        # Bumped on every (re)connect: notifications may have been missed, so
        # every waiter wakes and re-probes.
        self._epoch = 0
        # queue -> number of notifications seen; compared against each
        # thread's count from the end of its previous wait, so work that
        # arrived between two waits is not slept through.
        # Only queues some waiter asked about are counted (queue names are
        # open-ended), and only their notifications wake anyone.
        self._queued_seen: dict[str, int] = {}
        self._local = threading.local()
        self._done_waiting = 0
        # Whether cairnq_done should be heard (whether it is: DONE_CHANNEL in
        # _channels). Every finished task notifies every listener of it; a
        # worker that nobody waits in turns it off (hear_done_on_demand), so a
        # fleet of N workers is not woken N times per finished task. The first
        # wait turns it on.
        self._hear_done = True
        # Every cairnq_done counts; recent task ids remember the count at
        # which they finished. A waiter wakes for finishes after its baseline.
        self._done_count = 0
        self._recent_done: OrderedDict[str, int] = OrderedDict()
        # key -> "drained" announcements heard (drained.py); only keys
        # some waiter asked about, like _queued_seen.
        self._drained_seen: dict[str, int] = {}
        # key -> the workers heard announcing it (a few suffice), for peers_announced.
        self._drained_senders: dict[str, set[str]] = {}
        self._drained_waiting = 0
        self.backend_pid: int | None = None
        self.connects = 0

    # ------------------------------------------------------------- listening
    def _start(self) -> None:
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._listen_forever, name="cairnq-wakeup-listen", daemon=True
                )
                self._thread.start()

    def ready(self, timeout_s: float) -> bool:
        self._start()
        with self._cond:
            self._cond.wait_for(lambda: self._listening or self._closed, timeout_s)
            return self._listening

    def _listen_forever(self) -> None:
        import psycopg

        backoff = RECONNECT_INITIAL_S
        while not self._stop.is_set():
            conn = None
            try:
                conn = psycopg.connect(**self._params, autocommit=True)
                with self._cond:
                    self._channels = set()
                    self._book.lost_all()  # a new session holds no lock
                if self._probe is not None:
                    # Heard only while a probe is out (_wanted_channels).
                    conn.execute(sql.LISTEN.format(channel=PROBE_CHANNEL))
                    with self._cond:
                        self._channels = {PROBE_CHANNEL}
                    self._probe.start()
                self._sync_channels(conn)
                with self._cond:
                    self._listening = True
                    self._epoch += 1
                    self.connects += 1
                    self.backend_pid = conn.info.backend_pid
                    self._wake_all()
                backoff = RECONNECT_INITIAL_S
                acted = False
                while not self._stop.is_set():
                    # Statements just run may have read notifications into
                    # psycopg's backlog, which the socket no longer shows.
                    self._wait_readable(conn, 0.0 if acted else self._wait_s())
                    for note in conn.notifies(timeout=0.0):
                        self._dispatch(note.channel, note.payload)
                    if self._probe is not None:
                        self._probe.check()
                    acted = self._tend_seats(conn)
                    acted = self._sync_channels(conn) or acted
            except Exception as exc:  # any failure means "reconnect later"
                if not self._stop.is_set():
                    logger.warning(
                        "The CairnQ wakeup listener lost its database connection (%s); "
                        "waits fall back to sleeping and it reconnects in %.1fs.",
                        exc,
                        backoff,
                    )
            finally:
                with self._cond:
                    self._listening = False
                    self._channels = set()  # the session, and what it listened to, are gone
                    self.backend_pid = None
                if conn is not None:
                    self._give_up_seats(conn)
                    with suppress(Exception):
                        conn.close()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _wait_s(self) -> float:
        with self._cond:
            deadline = self._book.next_deadline()
        if deadline is None:
            return LISTEN_SLICE_S
        return min(LISTEN_SLICE_S, max(0.0, deadline - time.monotonic()))

    def _wait_readable(self, conn: Any, timeout_s: float) -> None:
        """Block until the session has something to read, a worker pokes, or the timeout."""
        ready, _, _ = select.select([conn.fileno(), self._poke_r], [], [], timeout_s)
        if self._poke_r in ready:
            with suppress(BlockingIOError):
                while self._poke_r.recv(64):
                    pass

    def _poke(self) -> None:
        with suppress(OSError):  # full (a poke is pending anyway) or closed
            self._poke_w.send(b"\0")

    # ------------------------------------------------------------- channels
    def _seats_decided(self) -> bool:
        """Whether seats may be held: notifications are known to arrive (no pooler in between)."""
        return bool(self._seats) and (self._probe is None or self._probe.delivering is True)

    def _wanted_channels(self) -> set[str]:
        """The channels this session should LISTEN now (call with the lock held).

        A session listening to any channel is signalled for every NOTIFY in
        the database and reads it in a transaction (seats.py): a standby with
        nobody waiting for a finish listens to nothing.
        """
        channels = {PROBE_CHANNEL} if self._probe is not None and self._probe.pending else set()
        if self._hear_done:
            channels.add(DONE_CHANNEL)
        decided = self._seats_decided() and self._book.in_use
        if not decided or self._book.held:
            channels |= {QUEUED_CHANNEL, DRAINED_CHANNEL}
        return channels

    def _sync_channels(self, conn: Any) -> bool:
        """LISTEN and UNLISTEN until the session hears what it should; True if it changed.

        A wake channel newly heard wakes every waiter once: what was sent
        while nobody here listened is found by looking again.
        """
        with self._cond:
            wanted = self._wanted_channels()
            current = set(self._channels)
        if wanted == current:
            return False
        for channel in sorted(wanted - current):
            conn.execute(sql.LISTEN.format(channel=channel))
        for channel in sorted(current - wanted):
            conn.execute(sql.UNLISTEN.format(channel=channel))
        with self._cond:
            self._channels = wanted
            if {QUEUED_CHANNEL, DONE_CHANNEL} & (wanted - current):
                self._epoch += 1
                self._wake_all()
        return True

    # ---------------------------------------------------------------- seats
    def seek_seat(self, key: str) -> None:
        if not self._seats:
            return
        with self._cond:
            self._book.seek(key)
        self._poke()

    def leave_seat(self, key: str) -> None:
        if not self._seats:
            return
        with self._cond:
            self._book.leave(key, time.monotonic())
        self._poke()

    def answers_queued(self, key: str) -> bool:
        with self._cond:
            if not (self._seats_decided() and self._book.in_use):
                return True  # every worker listens (no seats, or not yet decided)
            return key in self._book.held

    @property
    def seats_held(self) -> dict[str, int]:
        with self._cond:
            return dict(self._book.held)

    def _tend_seats(self, conn: Any) -> bool:
        """Give up the seats whose grace ran out, try for the ones wanted; True if it acted."""
        now = time.monotonic()
        with self._cond:
            if not self._seats_decided():
                releases, tries = list(self._book.held), []
            else:
                releases, tries = self._book.due_releases(now), self._book.due_tries(now)
        for key in releases:
            self._give_up_seat(conn, key)
        for key in tries:
            row = conn.execute(*take_seat(key, self._seats)).fetchone()
            with self._cond:
                self._book.took(key, row[0], now)
        return bool(releases or tries)

    def _give_up_seat(self, conn: Any, key: str) -> None:
        with self._cond:
            seat = self._book.held.get(key)
        if seat is not None:
            conn.execute(*give_up_seat(key, seat, self._seats))
        with self._cond:
            self._book.gave_up(key)

    def _give_up_seats(self, conn: Any) -> None:
        """On the way out: hand the seats over at once rather than after a standby's retry."""
        with self._cond:
            keys = list(self._book.held)
        for key in keys:
            with suppress(Exception):
                self._give_up_seat(conn, key)
        with self._cond:
            self._book.lost_all()

    def hear_done_on_demand(self) -> None:
        with self._cond:
            if DONE_CHANNEL not in self._channels and not self._done_waiting:
                self._hear_done = False

    @property
    def delivering(self) -> bool | None:
        """Whether the last delivery probe was heard (None: no answer yet, or no probe)."""
        return self._probe.delivering if self._probe is not None else None

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == PROBE_CHANNEL:
            if self._probe is not None:
                self._probe.heard(payload)
            return
        with self._cond:
            if channel == QUEUED_CHANNEL:
                if payload not in self._queued_seen:
                    return
                self._queued_seen[payload] += 1
            elif channel == DRAINED_CHANNEL:
                key, sender = parse_announcement(payload)
                if key not in self._drained_seen:
                    return
                self._drained_seen[key] += 1
                senders = self._drained_senders.setdefault(key, set())
                if len(senders) < _SENDERS_KEPT:
                    senders.add(sender)
                if not self._drained_waiting:
                    return  # only a deferring worker needs waking for it
            elif channel == DONE_CHANNEL:
                self._done_count += 1
                self._recent_done[payload] = self._done_count
                self._recent_done.move_to_end(payload)
                while len(self._recent_done) > RECENT_DONE_LIMIT:
                    self._recent_done.popitem(last=False)
                if not self._done_waiting:
                    # Idle workers wait on queues; a busy system's stream of
                    # finishes need not wake them.
                    return
            self._wake_all()

    # ----------------------------------------------------------------- waits
    def wait_for_queued(
        self, queues: Sequence[str], timeout_s: float, due_before: float | None = None
    ) -> bool:
        self._start()
        queues = list(queues)
        with self._cond:
            last = getattr(self._local, "queued", None)
            epoch = self._epoch
            # First wait on this thread: nothing to compare against yet.
            base = dict(last) if last else {}
            for q in queues:
                self._queued_seen.setdefault(q, 0)
                base.setdefault(q, self._queued_seen[q])

        def arrived() -> bool:
            return self._epoch != epoch or any(
                self._queued_seen.get(q, 0) != base[q] for q in queues
            )

        woken = self._wait_until(arrived, timeout_s)
        with self._cond:
            self._local.queued = {q: self._queued_seen.get(q, 0) for q in queues}
        return woken

    # ------------------------------------------------------ fleet coordination
    @property
    def healthy(self) -> bool:
        # Behind PgBouncer's transaction pooling LISTEN succeeds but hears
        # nothing: only a probe that was heard makes rare polling safe.
        if not self._listening or self._closed:
            return False
        return self._probe is None or self._probe.delivering is True

    @property
    def hears_drained(self) -> bool:
        return True

    def drained_seen(self, key: str) -> int:
        self._start()
        with self._cond:
            return self._drained_seen.setdefault(key, 0)

    def peers_announced(self, key: str, worker_id: str) -> bool:
        with self._cond:
            self._drained_seen.setdefault(key, 0)  # count announcements from now on
            return any(sender != worker_id for sender in self._drained_senders.get(key, ()))

    def wait_for_drained(self, key: str, since: int, timeout_s: float) -> bool:
        with self._cond:
            self._drained_seen.setdefault(key, 0)
            self._drained_waiting += 1
        try:
            return self._wait_until(lambda: self._drained_seen[key] > since, timeout_s)
        finally:
            with self._cond:
                self._drained_waiting -= 1

    def _done_predicate(self, task_id: str | None, base: int | None) -> Callable[[], bool]:
        """Return a check for finishes counted after `base` (None: from now on)."""
        self._start()
        with self._cond:
            # Heard once the listener has LISTENed (it is poked); until then
            # the caller's own poll of the task's status covers the gap.
            poke = not self._hear_done
            self._hear_done = True
            epoch = self._epoch
            since = self._done_count if base is None else base
        if poke:
            self._poke()

        def finished() -> bool:
            if self._epoch != epoch:
                return True
            if task_id is None:
                return self._done_count > since
            return self._recent_done.get(task_id, 0) > since

        return finished

    def wait_for_done(self, task_id: str | None, timeout_s: float) -> bool:
        # The baseline is where this thread's previous wait ended, so a task
        # that finished between that wait and this one wakes it at once.
        with self._cond:
            base = getattr(self._local, "done", None)
            self._done_waiting += 1
        try:
            woken = self._wait_until(self._done_predicate(task_id, base), timeout_s)
        finally:
            with self._cond:
                self._done_waiting -= 1
                self._local.done = self._done_count
        return woken

    async def await_done(self, task_id: str | None, timeout_s: float) -> bool:
        with self._cond:
            self._done_waiting += 1
        try:
            return await self._await_until(self._done_predicate(task_id, None), timeout_s)
        finally:
            with self._cond:
                self._done_waiting -= 1

    def close(self) -> None:
        super().close()
        self._stop.set()
        self._poke()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=LISTEN_SLICE_S * 8)
        if thread is None or not thread.is_alive():
            for end in (self._poke_r, self._poke_w):
                end.close()
