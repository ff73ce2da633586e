"""Listening seats: only a few idle workers per configuration hear new tasks (wakeup/seats.py).

The waits here are upper bounds for what wakes do in milliseconds; the
workers' polls are set minutes apart, so a task picked up at all was picked
up by a wake.
"""

from __future__ import annotations

import random

import pytest
from django.db import connection, connections

from cairnq_django import client, enqueue, get
from cairnq_django.records import DONE_CHANNEL, QUEUED_CHANNEL
from cairnq_django.wakeup import PostgresWakeup
from cairnq_django.wakeup import seats as seats_module
from cairnq_django.wakeup.postgres import postgres_params
from cairnq_django.wakeup.seats import (
    SEAT_LOCK_SPACE,
    SEAT_RELEASE_GRACE_S,
    SeatBook,
    seat_lock_ids,
)
from tests.workerutil import WorkerProcess, wait_for

only_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="advisory locks, LISTEN")

KEY = "k" * 24


# ------------------------------------------------------------------ the book
def test_a_seat_is_sought_at_once_and_given_up_after_the_grace():
    book = SeatBook(rng=random.Random(1))
    assert not book.in_use
    book.seek(KEY)
    assert book.in_use and book.due_tries(0.0) == [KEY]
    book.took(KEY, 0, now=0.0)
    assert book.held == {KEY: 0} and book.due_tries(0.0) == []
    book.leave(KEY, now=10.0)
    assert book.due_releases(10.0) == []
    assert book.due_releases(10.0 + SEAT_RELEASE_GRACE_S) == [KEY]


def test_seeking_again_within_the_grace_keeps_the_seat():
    book = SeatBook()
    book.seek(KEY)
    book.took(KEY, 1, now=0.0)
    book.leave(KEY, now=1.0)
    book.seek(KEY)
    assert book.due_releases(100.0) == [] and book.held == {KEY: 1}


def test_a_standby_tries_again_rarely_and_at_random():
    book = SeatBook(rng=random.Random(3))
    book.seek(KEY)
    book.took(KEY, None, now=0.0)  # every seat taken
    assert book.due_tries(1.0) == []
    retry_at = book.next_deadline()
    assert retry_at is not None
    assert seats_module.SEAT_RETRY_S * 0.5 <= retry_at <= seats_module.SEAT_RETRY_S * 1.5
    assert book.due_tries(retry_at) == [KEY]


def test_a_worker_in_another_process_counts_once_per_seek():
    book = SeatBook()
    book.seek(KEY)
    book.seek(KEY)  # two workers of one process, one seat
    book.took(KEY, 0, now=0.0)
    book.leave(KEY, now=0.0)
    assert book.due_releases(100.0) == []  # the other still wants it
    book.leave(KEY, now=0.0)
    assert book.due_releases(100.0) == [KEY]


def test_a_lost_session_makes_every_wanted_key_try_again():
    book = SeatBook()
    book.seek(KEY)
    book.took(KEY, 0, now=0.0)
    book.lost_all()
    assert book.held == {} and book.due_tries(0.0) == [KEY]


def test_seat_locks_are_distinct_per_seat_and_key():
    ids = seat_lock_ids(KEY, 3) + seat_lock_ids("j" * 24, 3)
    assert len(set(ids)) == 6
    assert all(-(2**31) <= i < 2**31 for i in ids)


# ------------------------------------------------------------ on PostgreSQL
def _seat_locks() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND objsubid = 2 AND granted",
            [SEAT_LOCK_SPACE],
        )
        return cursor.fetchone()[0]


def _settled(w: PostgresWakeup) -> bool:
    """Whether the listener acted on its wish: seated and hearing, or standing by."""
    channels = w._channels
    if w.seats_held:
        return QUEUED_CHANNEL in channels
    # A standby listens to nothing: PostgreSQL signals every listening session.
    return channels <= {DONE_CHANNEL}


@pytest.fixture
def seeking(live_store, monkeypatch):
    """Start listeners that share one seat and each seek it; closed after the test."""
    monkeypatch.setattr(seats_module, "SEAT_RETRY_S", 0.2)
    made: list[PostgresWakeup] = []

    def start(count: int) -> list[PostgresWakeup]:
        for _ in range(count):
            w = PostgresWakeup(postgres_params("default"), seats=1)
            made.append(w)
            assert w.ready(30)
            w.seek_seat(KEY)
        wait_for(lambda: all(_settled(w) for w in made), timeout=30)
        return list(made)

    yield start
    for w in made:
        w.close()


@only_postgres
def test_only_the_seated_listeners_hear_new_tasks_and_a_standby_takes_a_freed_seat(seeking):
    listeners = seeking(3)
    seated = [w for w in listeners if w.seats_held]
    assert len(seated) == 1 and _seat_locks() == 1
    holder = seated[0]
    standbys = [w for w in listeners if w is not holder]

    # The holder hears a new task; the standbys do not LISTEN for it.
    epoch_before = [w._epoch for w in standbys]
    baseline = holder._queued_seen.setdefault("seated", 0)
    enqueue("seats.t", {}, queue="seated")
    wait_for(lambda: holder._queued_seen["seated"] > baseline, timeout=30)

    # Full: it gives the seat up, and a standby's next try takes it; it looks again.
    holder.leave_seat(KEY)
    wait_for(lambda: any(w.seats_held for w in standbys) and not holder.seats_held, timeout=30)
    wait_for(lambda: all(_settled(w) for w in listeners), timeout=30)
    taker = next(w for w in standbys if w.seats_held)
    assert taker._epoch > epoch_before[standbys.index(taker)]
    assert sum(bool(w.seats_held) for w in listeners) == 1 and _seat_locks() == 1
    baseline = taker._queued_seen.setdefault("taken", 0)
    enqueue("seats.t", {}, queue="taken")
    wait_for(lambda: taker._queued_seen["taken"] > baseline, timeout=30)
    for w in listeners:
        w.close()
    assert _seat_locks() == 0


@only_postgres
def test_a_seat_whose_holder_died_is_taken_again(seeking):
    listeners = seeking(2)
    holder = next(w for w in listeners if w.seats_held)
    old_pid = holder.backend_pid
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    # Its session, and the lock, are gone without a word: whoever retries
    # first (the standby's timer or the holder's reconnect) holds it next.
    wait_for(lambda: holder.connects >= 2, timeout=30)
    wait_for(lambda: sum(bool(w.seats_held) for w in listeners) == 1, timeout=30)
    wait_for(lambda: all(_settled(w) for w in listeners), timeout=30)
    assert _seat_locks() == 1


@only_postgres
def test_without_seats_every_listener_hears_new_tasks(live_store):
    w = PostgresWakeup(postgres_params("default"), seats=None)
    try:
        assert w.ready(30)
        w.seek_seat(KEY)  # no seats configured: a no-op
        wait_for(lambda: QUEUED_CHANNEL in w._channels, timeout=30)
        assert not w.seats_held
    finally:
        w.close()


@only_postgres
def test_only_a_seated_worker_wakes_for_a_due_time_it_read(seeking):
    # Standbys read the next due time at their polls too; they leave it to the seat.
    listeners = seeking(3)
    assert [w.answers_queued(KEY) for w in listeners] == [bool(w.seats_held) for w in listeners]
    assert sum(w.answers_queued(KEY) for w in listeners) == 1
    unseated = PostgresWakeup(postgres_params("default"), seats=None)
    try:
        assert unseated.ready(30)
        assert unseated.answers_queued(KEY)  # no seats: every worker answers
    finally:
        unseated.close()


@only_postgres
@pytest.mark.slow
def test_worker_processes_hand_the_seat_over_when_its_holder_is_busy(live_store, child_env):
    # One seat among three workers of one slot each, polls five minutes apart:
    # a task enqueued after start runs only if a seated worker hears it, so the
    # last one runs only if two busy holders handed the seat over in turn.
    settings = {"LISTENERS": 1, "POLL_INTERVAL": 60_000}
    workers = [
        WorkerProcess(child_env, "--concurrency", "1", "-v", "2", settings=settings)
        for _ in range(3)
    ]
    blockers = []
    try:
        wait_for(lambda: all("starting" in w.output() for w in workers), timeout=90)
        wait_for(lambda: _workers_recorded() == 3, timeout=60)
        wait_for(lambda: _seat_locks() == 1, timeout=60)
        first = enqueue("tests.echo", {"n": 1})
        wait_for(lambda: get(first.id).status == "succeeded", timeout=60)
        for _ in range(2):
            blocker = enqueue("tests.wait_cancel", {"timeout": 120})
            blockers.append(blocker)
            wait_for(lambda b=blocker: get(b.id).status == "running", timeout=60)
        last = enqueue("tests.echo", {"n": 2})
        wait_for(lambda: get(last.id).status == "succeeded", timeout=60)
        assert _seat_locks() == 1
    finally:
        for blocker in blockers:
            client.cancel(blocker.id)
        for w in workers:
            w.stop()


def _workers_recorded() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_django_workers")
        return cursor.fetchone()[0]

