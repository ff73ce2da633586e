"""Wakeups: early wakes when another process commits, and plain sleeps otherwise.

Every assertion is on what a wait returned (True: woken, False: timed out),
never on how long it took. Timeouts are generous; a missing wake shows up as a
False, not as a slow pass.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import override_settings

from cairnq_django import TaskTimeout, client, wakeup
from cairnq_django.records import DONE_CHANNEL
from cairnq_django.wakeup import (
    FileWatch,
    PostgresWakeup,
    SQLiteWakeup,
    Wakeup,
    get_wakeup,
    use_wakeup,
)
from cairnq_django.wakeup.postgres import postgres_params

ROOT = Path(__file__).resolve().parent.parent
VENDOR = connection.vendor
LONG = 60.0

only_postgres = pytest.mark.skipif(VENDOR != "postgresql", reason="Postgres LISTEN only")
only_sqlite = pytest.mark.skipif(VENDOR != "sqlite", reason="SQLite data_version only")


def run_child(env: dict, body: str) -> str:
    """Run a Python snippet in a fresh process on the test database."""
    script = "import django\ndjango.setup()\nfrom cairnq_django import client\n" + textwrap.dedent(
        body
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class InThread(threading.Thread):
    """Call fn(*args) on a thread and keep what it returned."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None

    def run(self):
        try:
            self.result = self.fn(*self.args)
        except BaseException as exc:  # handed to the test thread
            self.error = exc
        finally:
            connections.close_all()

    def outcome(self):
        self.join(LONG * 2)
        assert not self.is_alive(), "the waiting thread never returned"
        if self.error is not None:
            raise self.error
        return self.result


def until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"Gave up waiting for {what}.")
        time.sleep(0.01)


@pytest.fixture
def wake(live_store):
    w = get_wakeup("default")
    assert w.ready(30), "the wakeup never started listening"
    yield w
    wakeup.close_all()


def start_waiting(w, n, fn, *args) -> InThread:
    thread = InThread(fn, *args)
    thread.start()
    until(lambda: w.waiting >= n or not thread.is_alive(), "the waiter to register")
    if not thread.is_alive():
        thread.outcome()  # raises what went wrong on the thread
    return thread


def test_get_wakeup_picks_the_signal_for_the_vendor(wake):
    expected = PostgresWakeup if VENDOR == "postgresql" else SQLiteWakeup
    assert type(wake) is expected
    assert get_wakeup("default") is wake


def test_queued_wake_arrives_when_another_process_enqueues(wake, child_env):
    mine = start_waiting(wake, 1, wake.wait_for_queued, ["wq"], LONG)
    elsewhere = start_waiting(wake, 2, wake.wait_for_queued, ["elsewhere"], LONG)
    run_child(child_env, 'client.enqueue("wake.me", {"n": 1}, queue="wq")')
    assert mine.outcome() is True
    # The other queue's waiter is still asleep; closing releases it as "not woken".
    elsewhere.join(1.0)
    assert elsewhere.is_alive()
    wake.close()
    assert elsewhere.outcome() is False


def test_work_committed_between_two_waits_is_not_slept_through(wake, child_env):
    # A thread's first wait sets its baseline; work that lands before its next
    # wait starts must end that next wait at once.
    def two_waits():
        first = wake.wait_for_queued(["between"], 0.05)
        run_child(child_env, 'client.enqueue("wake.between", queue="between")')
        if VENDOR == "postgresql":
            # The notification is delivered asynchronously; let it land first.
            until(lambda: wake._queued_seen.get("between"), "the notification")
        return first, wake.wait_for_queued(["between"], LONG)

    thread = InThread(two_waits)
    thread.start()
    assert thread.outcome() == (False, True)


def test_a_finish_between_two_waits_is_not_slept_through(wake, live_store, child_env):
    task = live_store.submit("wake.between_done", queue="between")

    def two_waits():
        first = wake.wait_for_done(task.id, 0.05)
        run_child(child_env, f'client.cancel("{task.id}")')
        if VENDOR == "postgresql":
            until(lambda: task.id in wake._recent_done, "the notification")
        return first, wake.wait_for_done(task.id, LONG)

    thread = InThread(two_waits)
    thread.start()
    assert thread.outcome() == (False, True)


def test_done_wake_arrives_when_another_process_finishes_the_task(wake, live_store, child_env):
    task = live_store.submit("wake.done", queue="dq")
    other = live_store.submit("wake.other", queue="dq")
    this_one = start_waiting(wake, 1, wake.wait_for_done, task.id, LONG)
    not_this = start_waiting(wake, 2, wake.wait_for_done, other.id, LONG)
    # Last: a wait on any task may wake early ("may have finished" is its
    # contract), and an early return must not stall the registration count.
    any_one = start_waiting(wake, 3, wake.wait_for_done, None, LONG)
    run_child(child_env, f'client.cancel("{task.id}")')
    assert this_one.outcome() is True
    assert any_one.outcome() is True
    not_this.join(1.0)
    assert not_this.is_alive()
    wake.close()
    assert not_this.outcome() is False


def test_waits_time_out_when_nothing_happens(wake):
    assert wake.wait_for_queued(["idle"], 0.2) is False
    assert wake.wait_for_done("no-such-task", 0.2) is False
    assert asyncio.run(wake.await_done("no-such-task", 0.2)) is False
    assert asyncio.run(wake.await_done(None, 0.2)) is False
    assert wake.waiting == 0


def test_plain_wakeup_only_sleeps():
    plain = Wakeup()
    assert plain.ready(1) is False
    assert plain.wait_for_queued(["q"], 0.01) is False
    assert plain.wait_for_done(None, 0.01) is False
    assert asyncio.run(plain.await_done("t", 0.01)) is False
    plain.close()


def test_wakeups_can_be_turned_off(live_store):
    wakeup.close_all()
    with override_settings(CAIRNQ={"WAKEUPS": False}):
        assert type(get_wakeup("default")) is Wakeup
    wakeup.close_all()


class Recording(Wakeup):
    """Delegates wait()'s sleeps to a real wakeup and records what each returned."""

    def __init__(self, inner: Wakeup) -> None:
        self.inner, self.wakes = inner, []

    def wait_for_done(self, task_id, timeout_s):
        self.wakes.append(self.inner.wait_for_done(task_id, timeout_s))
        return self.wakes[-1]

    async def await_done(self, task_id, timeout_s):
        self.wakes.append(await self.inner.await_done(task_id, timeout_s))
        return self.wakes[-1]


def test_wait_sleeps_on_the_registered_wakeup(live_store):
    # wait() takes its sleeps from the registry the worker uses, not from a hook.
    task = live_store.submit("wake.registry", queue="wait")
    plain = Recording(Wakeup())
    with use_wakeup("default", plain):
        with pytest.raises(TaskTimeout):
            client.wait(task.id, timeout=0.05, poll_initial=10, poll_max=10)
    assert plain.wakes and not any(plain.wakes)


def test_wait_is_woken_by_the_done_signal(wake, live_store, child_env):
    recording = Recording(wake)
    task = live_store.submit("wake.wait", queue="wait")
    # A poll interval far longer than the test: only a wake can end the sleep early.
    with use_wakeup("default", recording):
        waiter = start_waiting(
            wake,
            1,
            lambda: client.wait(
                task.id,
                timeout=LONG,
                poll_initial=int(LONG * 1000),
                poll_max=int(LONG * 1000),
                raise_on_failure=False,
            ),
        )
        run_child(child_env, f'client.cancel("{task.id}")')
        assert waiter.outcome().status == "canceled"
    assert recording.wakes == [True]


def test_await_task_is_woken_by_the_done_signal(wake, live_store, child_env):
    recording = Recording(wake)
    task = live_store.submit("wake.await", queue="wait")

    async def scenario():
        try:
            return await client.await_task(
                task.id,
                timeout=LONG,
                poll_initial=int(LONG * 1000),
                poll_max=int(LONG * 1000),
                raise_on_failure=False,
            )
        finally:
            await sync_to_async(connections.close_all)()

    with use_wakeup("default", recording):
        waiter = start_waiting(wake, 1, lambda: asyncio.run(scenario()))
        run_child(child_env, f'client.cancel("{task.id}")')
        assert waiter.outcome().status == "canceled"
    assert recording.wakes == [True]


def test_coroutines_and_threads_wait_side_by_side(wake, live_store, child_env):
    task = live_store.submit("wake.mixed", queue="mixed")
    other = live_store.submit("wake.mixed_other", queue="mixed")

    async def this_one():
        return await wake.await_done(task.id, LONG)

    async def not_this():
        return await wake.await_done(other.id, LONG)

    async def both():
        return await asyncio.gather(this_one(), not_this())

    on_loop = start_waiting(wake, 2, lambda: asyncio.run(both()))
    on_thread = start_waiting(wake, 3, wake.wait_for_done, task.id, LONG)
    run_child(child_env, f'client.cancel("{task.id}")')
    assert on_thread.outcome() is True
    # The coroutine for `task` returned; the one for `other` still waits.
    until(lambda: wake.waiting == 1, "the woken coroutine to return")
    on_loop.join(1.0)
    assert on_loop.is_alive()
    wake.close()
    assert on_loop.outcome() == [True, False]


@only_postgres
def test_listener_reconnects_after_its_backend_is_killed(wake, child_env):
    old_pid = wake.backend_pid
    assert old_pid and wake.connects == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
        assert cursor.fetchone()[0] is True
    until(lambda: wake.connects >= 2 and wake.backend_pid, "the listener to reconnect")
    assert wake.backend_pid != old_pid
    mine = start_waiting(wake, 1, wake.wait_for_queued, ["after"], LONG)
    run_child(child_env, 'client.enqueue("wake.after", queue="after")')
    assert mine.outcome() is True


@only_postgres
def test_a_worker_hears_finishes_only_once_something_waits_for_one(live_store, child_env):
    # Every finished task notifies every listener of cairnq_done; a worker's
    # wakeup (hear_done_on_demand) leaves that channel alone until a wait needs it.
    first = live_store.submit("wake.unheard", queue="dq")
    second = live_store.submit("wake.heard", queue="dq")
    w = PostgresWakeup(postgres_params("default"))
    try:
        w.hear_done_on_demand()
        assert w.ready(30)
        marker = start_waiting(w, 1, w.wait_for_queued, ["marker"], LONG)
        # Notifications arrive in commit order: once the marker's is heard,
        # the cancel's finish would have been heard before it.
        run_child(child_env, f'client.cancel("{first.id}")\nclient.enqueue("wake.m", queue="marker")')
        assert marker.outcome() is True
        assert first.id not in w._recent_done and w._done_count == 0
        # The first wait turns hearing on, and starting to hear wakes it (a
        # finish may have slipped past before the LISTEN): its caller looks again.
        first_wait = start_waiting(w, 1, w.wait_for_done, second.id, LONG)
        until(lambda: DONE_CHANNEL in w._channels, "the listener to hear finishes")
        assert first_wait.outcome() is True
        assert second.id not in w._recent_done
        waiter = start_waiting(w, 1, w.wait_for_done, second.id, LONG)
        run_child(child_env, f'client.cancel("{second.id}")')
        assert waiter.outcome() is True
        assert second.id in w._recent_done
    finally:
        w.close()


@only_postgres
def test_waits_sleep_while_the_listener_is_down(live_store):
    params = dict(postgres_params("default"), port=1)  # nothing listens there
    down = PostgresWakeup(params)
    try:
        assert down.ready(0.5) is False
        assert down.wait_for_queued(["q"], 0.2) is False
        assert down.wait_for_done("t", 0.2) is False
    finally:
        down.close()


@only_sqlite
def test_unreadable_database_falls_back_to_sleep(tmp_path):
    missing = SQLiteWakeup(str(tmp_path / "no-such-dir" / "db.sqlite3"))
    assert missing.ready(1) is False
    assert missing.wait_for_queued(["q"], 0.1) is False
    assert missing.wait_for_done("t", 0.1) is False
    assert missing.broken
    missing.close()


@only_sqlite
def test_sqlite_poller_reopens_its_connection_after_an_error(wake, child_env):
    mine = start_waiting(wake, 1, wake.wait_for_queued, ["reopen"], LONG)
    with wake._db_lock:
        wake._db.close()  # the next PRAGMA fails as a broken connection would
    until(lambda: wake.failures >= 1 and wake.broken is None, "the poller to reopen")
    assert mine.is_alive()
    run_child(child_env, 'client.enqueue("wake.reopen", queue="reopen")')
    assert mine.outcome() is True


@only_sqlite
def test_sqlite_wake_skips_commits_without_work_for_the_queue(wake, live_store, child_env):
    mine = start_waiting(wake, 1, wake.wait_for_queued, ["quiet"], LONG)
    # Commits that touch other queues change data_version but leave this one empty.
    run_child(child_env, 'client.enqueue("wake.noise", queue="noisy")')
    mine.join(1.0)
    assert mine.is_alive()
    run_child(child_env, 'client.enqueue("wake.work", queue="quiet")')
    assert mine.outcome() is True


@only_sqlite
def test_sqlite_poller_sleeps_on_the_file_watch_and_wakes_on_a_commit(wake, child_env):
    mine = start_waiting(wake, 1, wake.wait_for_queued, ["watched"], LONG)
    until(lambda: wake._watch is not None, "the poller to open its inotify watch")
    run_child(child_env, 'client.enqueue("wake.watched", queue="watched")')
    assert mine.outcome() is True


@only_sqlite
def test_sqlite_wakes_by_polling_where_there_is_no_inotify(live_store, child_env, monkeypatch):
    monkeypatch.setattr(FileWatch, "open", classmethod(lambda cls, path: None))
    w = get_wakeup("default")
    try:
        assert w.ready(30)
        mine = start_waiting(w, 1, w.wait_for_queued, ["polled"], LONG)
        run_child(child_env, 'client.enqueue("wake.polled", queue="polled")')
        assert mine.outcome() is True
        assert w._watch is None
    finally:
        wakeup.close_all()


def test_file_watch_reports_writes_to_the_database_files_only(tmp_path):
    db = tmp_path / "queue.sqlite3"
    db.write_bytes(b"")
    watch = FileWatch.open(str(db))
    if watch is None:
        pytest.skip("no inotify on this system")
    try:
        assert watch.wait(0.05) is False  # nothing written yet
        (tmp_path / "unrelated.log").write_text("noise")
        assert watch.wait(0.05) is False  # another file in the directory
        (tmp_path / "queue.sqlite3-wal").write_bytes(b"frame")
        assert watch.wait(LONG) is True
        waiter = InThread(watch.wait, LONG)
        waiter.start()
        watch.interrupt()
        assert waiter.outcome() is False  # a close need not wait the sleep out
    finally:
        watch.close()
    watch.interrupt()  # after close: a no-op, not a write to a reused descriptor


def test_file_watch_is_none_for_a_missing_directory(tmp_path):
    assert FileWatch.open(str(tmp_path / "missing" / "db.sqlite3")) is None
