"""A fleet of idle workers costs the database what one costs: no herd, rare polls, two sessions.

- Every NOTIFY reaches every idle worker; only about one of them claims
  (worker/idle.py, drained.py).
- With healthy wakeups an idle worker probes every few poll intervals, not
  every one.
- An idle worker process holds two sessions (its loop's and its listener's):
  presence is written on the loop's session.
"""

import contextlib
import os
import random
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections, transaction

from cairnq_django import Limit, enqueue, get
from cairnq_django.drained import DRAINED_CHANNEL, announcement, drained_key
from cairnq_django.wakeup import PostgresWakeup, get_wakeup
from cairnq_django.wakeup.postgres import postgres_params
from cairnq_django.worker import Registry, Worker
from cairnq_django.worker.idle import (
    DEFER_FIRST_S,
    DEFER_MAX_S,
    HEALTHY_POLL_FACTOR,
    PollTurn,
    idle_poll_s,
)
from tests.workerutil import WorkerProcess, wait_for

only_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY")


# ------------------------------------------------------------------ decisions
def _woken_claim(worker, started):
    """As if `worker`'s claim answering a wake started `started` calls."""
    turn = PollTurn(likely=False, woken=True, due_wake=False)
    worker._idle.end_poll(turn, started, filled=False, pending=False)


def test_a_worker_that_won_claims_at_once_and_one_that_lost_defers_longer_each_time():
    worker = Worker(registry=Registry(), concurrency=1, scheduler=False)
    pacing = worker._idle
    pacing._rng = random.Random(1)
    assert pacing._deferral_s() == 0
    _woken_claim(worker, started=0)
    first = pacing._deferral_s()
    assert DEFER_FIRST_S <= first <= 2 * DEFER_FIRST_S
    for _ in range(10):
        _woken_claim(worker, started=0)
    assert DEFER_MAX_S <= pacing._deferral_s() <= 2 * DEFER_MAX_S
    _woken_claim(worker, started=1)
    assert pacing._deferral_s() == 0


def test_healthy_wakeups_stretch_the_idle_poll_with_jitter():
    rng = random.Random(2)
    assert idle_poll_s(1000, healthy_wakeups=False, rng=rng) == 1.0
    polls = {idle_poll_s(1000, healthy_wakeups=True, rng=rng) for _ in range(50)}
    assert len(polls) > 1  # spread, so a fleet started together drifts apart
    assert all(0.75 * HEALTHY_POLL_FACTOR <= p <= 1.25 * HEALTHY_POLL_FACTOR for p in polls)


# ------------------------------------------------------------ announcements
A_KEY = drained_key(["default"], ["t.a"])


@pytest.fixture
def two_due(live_store):
    """Two due t.a tasks and a listener that counts the drained announcements for them."""
    listener = PostgresWakeup(postgres_params("default"))
    try:
        assert listener.ready(10)
        seen = listener.drained_seen(A_KEY)
        enqueue("t.a", {})
        enqueue("t.a", {})
        yield listener, seen
    finally:
        listener.close()


@only_postgres
def test_a_claim_that_leaves_nothing_announces_it_and_one_that_leaves_work_does_not(
    live_store, two_due,
):
    listener, seen = two_due
    # Takes one of two: work is left, so nothing is announced.
    live_store.claim(queues=["default"], worker_id="w1", limit=1, names=["t.a"],
                     announce=(A_KEY, ["t.a"]))
    # Takes the last one: announced, in the claim's own transaction.
    live_store.claim(queues=["default"], worker_id="w1", limit=1, names=["t.a"],
                     announce=(A_KEY, ["t.a"]))
    assert listener.wait_for_drained(A_KEY, seen, 10)
    assert listener.drained_seen(A_KEY) == seen + 1


@only_postgres
def test_a_limited_claim_that_leaves_nothing_announces_it_and_one_the_limit_held_back_does_not(
    live_store, two_due,
):
    listener, seen = two_due
    one_at_a_time = [Limit("name", "t.a", 1, None, None, "settings")]
    held_back = live_store.claim_limited(
        limits=one_at_a_time, queues=["default"], worker_id="w1", limit=2, names=["t.a"],
        announce=(A_KEY, ["t.a"]),
    )
    # The limit held the second back: it is still due, so nothing is announced.
    assert (len(held_back.tasks), held_back.held) == (1, 1)
    assert not listener.wait_for_drained(A_KEY, seen, 0.5)
    roomier = [Limit("name", "t.a", 5, None, None, "settings")]
    last = live_store.claim_limited(
        limits=roomier, queues=["default"], worker_id="w1", limit=2, names=["t.a"],
        announce=(A_KEY, ["t.a"]),
    )
    # Took the last one: announced, in the limited claim's own transaction.
    assert len(last.tasks) == 1
    assert listener.wait_for_drained(A_KEY, seen, 10)
    assert listener.drained_seen(A_KEY) == seen + 1


@only_postgres
def test_an_announcement_only_counts_for_the_same_queues_and_names(live_store):
    mine = drained_key(["default"], ["t.a", "t.b"])
    other = drained_key(["default"], ["t.a"])
    assert mine == drained_key(["default"], ["t.b", "t.a"])
    listener = PostgresWakeup(postgres_params("default"))
    try:
        assert listener.ready(10)
        seen = listener.drained_seen(mine)
        live_store.claim(queues=["default"], worker_id="w1", names=["t.a"], announce=(other, ["t.a"]))
        assert not listener.wait_for_drained(mine, seen, 0.5)
    finally:
        listener.close()


# --------------------------------------------------------------------- herd
class _Counting:
    """Count the store's claims and probes (the calls pass through unchanged)."""

    def __init__(self, store):
        self.claims = 0
        self.probes = 0
        self._lock = threading.Lock()
        self._store = store
        self._claim, self._probe = store.claim, store.probe_idle
        store.claim, store.probe_idle = self.claim, self.probe

    def restore(self):
        # The store is the alias's one instance: later tests must get it back unwrapped.
        del self._store.claim, self._store.probe_idle

    def claim(self, **kwargs):
        with self._lock:
            self.claims += 1
        return self._claim(**kwargs)

    def probe(self, **kwargs):
        with self._lock:
            self.probes += 1
        return self._probe(**kwargs)


def _start(workers):
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    return threads


def _stop(workers, threads):
    for worker in workers:
        worker.stop()
    for thread in threads:
        thread.join(30)


@only_postgres
def test_one_notify_is_answered_by_about_one_claim_however_many_workers_sleep(live_store):
    reg = Registry()
    reg.register("herd.noop", lambda ctx, payload: None)
    workers = [Worker(registry=reg, concurrency=2, scheduler=False) for _ in range(8)]
    counting = _Counting(workers[0].store)  # one store object per alias, shared
    wakeup = get_wakeup("default")
    threads = _start(workers)
    try:
        assert wakeup.ready(10)
        wait_for(lambda: wakeup.waiting >= len(workers), timeout=30)
        before = counting.claims
        tasks = 20
        for _ in range(tasks):
            task = enqueue("herd.noop", {})
            wait_for(lambda t=task: get(t.id).status == "succeeded", timeout=30)
            time.sleep(0.05)
        claims = counting.claims - before
    finally:
        _stop(workers, threads)
        counting.restore()
    # Each worker claimed for every task before (8 x 20 = 160). Now the
    # winner claims; the others learn within a few wakes and defer.
    assert claims <= 2 * tasks + 3 * len(workers), claims


@only_postgres
def test_a_task_enqueued_while_the_only_worker_defers_is_still_run(live_store):
    reg = Registry()
    reg.register("herd.noop", lambda ctx, payload: "ran")
    worker = Worker(registry=reg, concurrency=1, scheduler=False)
    for _ in range(10):
        _woken_claim(worker, started=0)  # as if it lost many races
    assert worker._idle._defer_s > 0
    threads = _start([worker])
    try:
        assert get_wakeup("default").ready(10)
        task = enqueue("herd.noop", {})
        # No other worker announces anything: the deferral runs out and it claims.
        done = wait_for(lambda: get(task.id).status == "succeeded" and get(task.id), timeout=30)
    finally:
        _stop([worker], threads)
    assert done.result == "ran"


@only_postgres
def test_an_idle_worker_with_healthy_wakeups_does_not_probe_every_poll_interval(live_store):
    reg = Registry()
    reg.register("herd.noop", lambda ctx, payload: None)
    worker = Worker(registry=reg, concurrency=1, scheduler=False, poll_ms=500)
    counting = _Counting(worker.store)
    wakeup = get_wakeup("default")
    threads = _start([worker])
    try:
        assert wakeup.ready(10)
        wait_for(lambda: wakeup.waiting >= 1, timeout=30)
        time.sleep(0.8)  # past the one poll interval it may start with
        before = counting.probes
        time.sleep(1.8)
        probes = counting.probes - before
    finally:
        _stop([worker], threads)
        counting.restore()
    # Every 500 ms before (3-4 here); now 5 intervals apart, +-25 %.
    assert probes <= 1


@only_postgres
@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/net/tcp").exists() or connection.settings_dict["HOST"].startswith("/"),
    reason="tells the worker's sessions by their TCP ports, from /proc",
)
def test_an_idle_worker_process_holds_two_sessions(live_store, child_env):
    name = connections["default"].settings_dict["NAME"]

    def sessions(pid: int) -> list[tuple]:
        # The worker's own sessions, told apart by their client ports: a
        # session this process or an earlier test's process holds (or is
        # still closing) on the same database is not the worker's.
        ports = _tcp_ports(pid)
        with connections["default"].cursor() as cursor:
            cursor.execute(
                "SELECT client_port, application_name, left(query, 60) FROM pg_stat_activity"
                " WHERE datname = %s AND backend_type = 'client backend'",
                [name],
            )
            return [row for row in cursor.fetchall() if row[0] in ports]

    worker = WorkerProcess(child_env, "--concurrency", "4", "-v", "2")
    try:
        wait_for(lambda: "starting" in worker.output(), timeout=90)
        wait_for(lambda: _recorded(), timeout=60)
        # The fewest over a few seconds: a session opened for a moment at
        # start (the system checks', the delivery probe's) may still be closing.
        held = []
        for _ in range(10):
            held.append(sessions(worker.pid))
            time.sleep(0.3)
        fewest = min(held, key=len)
    finally:
        worker.stop()
    # The claim loop's session and the listener's; presence used a third.
    assert len(fewest) == 2, held


def _tcp_ports(pid: int) -> set[int]:
    """The local TCP ports of `pid`'s open sockets, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed since the listing
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _recorded() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_django_workers")
        return cursor.fetchone()[0] > 0


# ----------------------------------------------------------- a lone worker
class _Announcements:
    """A wakeup stand-in that says whether peers announced, and records waits for one."""

    hears_drained = True

    def __init__(self, peers: bool) -> None:
        self.peers = peers
        self.waits = 0

    def peers_announced(self, key, worker_id):
        return self.peers

    def wait_for_drained(self, key, since, timeout_s):
        self.waits += 1
        return True


@pytest.mark.parametrize("peers", [False, True])
def test_a_worker_that_lost_races_waits_for_an_announcement_only_when_peers_announce(peers):
    reg = Registry()
    reg.register("herd.noop", lambda ctx, payload: None)
    worker = Worker(registry=reg, concurrency=1, scheduler=False)
    _woken_claim(worker, started=0)  # it lost a race
    worker._idle.wakeup = _Announcements(peers)
    # Alone, the race was lost to its own earlier claim: it claims at once.
    assert worker._idle._stand_down(0) is peers
    assert worker._idle.wakeup.waits == (1 if peers else 0)


@only_postgres
def test_the_listener_tells_a_worker_whether_another_worker_announced(live_store):
    key = drained_key(["default"], ["t.a"])
    listener = PostgresWakeup(postgres_params("default"))
    try:
        assert listener.ready(10)
        seen = listener.drained_seen(key)
        assert not listener.peers_announced(key, "w1")
        enqueue("t.a", {})
        live_store.claim(queues=["default"], worker_id="w1", limit=1, names=["t.a"],
                         announce=(announcement(key, "w1"), ["t.a"]))
        assert listener.wait_for_drained(key, seen, 10)
        # w1 heard only itself; any other worker has heard a peer.
        assert not listener.peers_announced(key, "w1")
        assert listener.peers_announced(key, "w2")
    finally:
        listener.close()


@only_postgres
def test_an_announcement_heard_before_the_wake_does_not_stand_a_worker_down(live_store):
    # Notifications arrive in commit order: an announcement committed before
    # the task was is from a claim that could not have taken it.
    reg = Registry()
    reg.register("herd.noop", lambda ctx, payload: "ran")
    # Polls minutes apart: the task runs only if the wake is answered.
    worker = Worker(registry=reg, concurrency=1, scheduler=False, poll_ms=60_000)
    for _ in range(10):
        _woken_claim(worker, started=0)  # it lost many races
    key = drained_key(worker.queues, worker.handlers)
    wakeup = get_wakeup("default")
    threads = _start([worker])
    try:
        assert wakeup.ready(10)
        wait_for(lambda: wakeup.waiting >= 1, timeout=30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [DRAINED_CHANNEL, announcement(key, "peer")])
            task = enqueue("herd.noop", {})
        done = wait_for(lambda: get(task.id).status == "succeeded" and get(task.id), timeout=30)
    finally:
        _stop([worker], threads)
    assert done.result == "ran"
