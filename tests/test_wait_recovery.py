"""wait()/call() and their async twins outlive a database that goes away (issue 9).

The outages here are real: the waiter's connection settings are pointed at a
database that is not there (a closed port, a file in a missing directory), or
on PostgreSQL its session and the wakeup listener's are terminated by the
server. The breaking and mending happen inside the waiter's own sleeps, so
each test knows exactly which probes failed. tests/reliability/test_pg_restart.py
restarts a whole PostgreSQL cluster under real workers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from contextlib import contextmanager

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import OperationalError, connections

import cairnq_django
from cairnq_django import TaskTimeout, waiting, wakeup
from cairnq_django.store.leases import get_leases
from cairnq_django.wakeup import Wakeup

WAIT_LOGGER = "cairnq_django.wait"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Outage:
    """Make the default database unreachable for this thread's next connects."""

    def __init__(self, tmp_path) -> None:
        self.config = connections["default"].settings_dict
        self.saved = {k: self.config.get(k) for k in ("NAME", "HOST", "PORT")}
        self.missing = str(tmp_path / "no-such-dir" / "gone.sqlite3")
        self.active = False

    def begin(self) -> None:
        if connections["default"].vendor == "sqlite":
            self.config["NAME"] = self.missing
        else:
            self.config["HOST"], self.config["PORT"] = "127.0.0.1", str(_closed_port())
        connections["default"].close()
        self.active = True

    def end(self) -> None:
        self.config.update(self.saved)
        connections["default"].close()
        self.active = False


@pytest.fixture(autouse=True)
def no_outage_on_record():
    """Each test starts with no database marked unreachable (process-wide state)."""
    waiting._down_since.clear()
    yield
    waiting._down_since.clear()


@pytest.fixture
def outage(live_store, tmp_path):
    # The wakeup copies the connection settings when it is built: build it
    # now, from the real ones.
    wakeup.get_wakeup("default")
    cut = Outage(tmp_path)
    yield cut
    if cut.active:
        cut.end()


class PlannedWakeup(Wakeup):
    """Runs `plan(n)` before wait()'s n-th sleep (from 1), then sleeps briefly on `inner`."""

    def __init__(self, plan, inner: Wakeup) -> None:
        self.plan, self.inner = plan, inner
        self.calls = {"n": 0}

    def wait_for_done(self, task_id, timeout_s):
        self.calls["n"] += 1
        self.plan(self.calls["n"])
        return self.inner.wait_for_done(task_id, min(timeout_s, 0.05))


@contextmanager
def sleeper(plan):
    """Make wait()'s sleeps run `plan(n)` first (n counts sleeps from 1), then sleep briefly."""
    planned = PlannedWakeup(plan, wakeup.get_wakeup("default"))
    with wakeup.use_wakeup("default", planned):
        yield planned.calls


def wait_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == WAIT_LOGGER and r.levelno == logging.WARNING]


def test_wait_rides_out_an_outage_and_warns_once(outage, caplog):
    task = cairnq_django.enqueue("echo", {"v": 1})

    def plan(n):
        if n == 1:
            outage.begin()
        elif n == 8:  # seven probes found the database missing
            outage.end()
            get_leases().claim(queues=["default"], worker_id="w")
            get_leases().complete(task.id, "w", {"v": 1})

    with caplog.at_level(logging.INFO, logger=WAIT_LOGGER), sleeper(plan) as calls:
        done = cairnq_django.wait(task.id, timeout=60, poll_initial=10, poll_max=50)
    assert done.status == "succeeded" and done.result == {"v": 1}
    assert calls["n"] >= 8
    warnings = wait_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert task.id in warnings[0] and "lost its connection" in warnings[0]
    assert any("reached database 'default' again" in r.getMessage() for r in caplog.records)


def test_call_rides_out_an_outage(outage):
    def plan(n):
        if n == 1:
            outage.begin()
        elif n == 4:
            outage.end()
            for task in get_leases().claim(queues=["default"], worker_id="w"):
                get_leases().complete(task.id, "w", {"doubled": task.payload["n"] * 2})

    with sleeper(plan):
        assert cairnq_django.call("double", {"n": 21}, timeout=60, poll_max=50) == {"doubled": 42}


def test_two_outages_warn_twice(outage, caplog):
    task = cairnq_django.enqueue("echo")

    def plan(n):
        if n in (1, 6):
            outage.begin()
        elif n in (3, 8):
            outage.end()
        if n == 10:
            get_leases().claim(queues=["default"], worker_id="w")
            get_leases().complete(task.id, "w", None)

    with caplog.at_level(logging.WARNING, logger=WAIT_LOGGER), sleeper(plan):
        assert cairnq_django.wait(task.id, timeout=60, poll_max=50).status == "succeeded"
    assert len(wait_warnings(caplog)) == 2


def test_timeout_while_unreachable_says_so(outage, caplog):
    task = cairnq_django.enqueue("echo")
    with caplog.at_level(logging.WARNING, logger=WAIT_LOGGER), sleeper(
        lambda n: outage.begin() if n == 1 else None
    ) as calls:
        with pytest.raises(TaskTimeout) as info:
            cairnq_django.wait(task.id, timeout=0.5, poll_initial=10, poll_max=50)
    error = info.value
    assert error.task_id == task.id and error.key is None and error.snapshot is None
    assert "unreachable at the end" in str(error) and "'default'" in str(error)
    assert isinstance(error.__cause__, OperationalError)
    assert calls["n"] >= 3  # it kept retrying
    assert len(wait_warnings(caplog)) == 1  # and said so once


def test_one_warning_per_outage_however_many_waits_notice_it(outage, caplog):
    task = cairnq_django.enqueue("echo")
    with caplog.at_level(logging.INFO, logger=WAIT_LOGGER):
        with sleeper(lambda n: outage.begin() if n == 1 else None):
            with pytest.raises(TaskTimeout):
                cairnq_django.wait(task.id, timeout=0.3, poll_initial=10)
        # The same outage, seen by the next waits from their first probe.
        for _ in range(2):
            with pytest.raises(TaskTimeout, match="unreachable"):
                cairnq_django.wait(task.id, timeout=0.2, poll_initial=10)
        assert len(wait_warnings(caplog)) == 1
        outage.end()
        with pytest.raises(TaskTimeout, match="still queued"):
            cairnq_django.wait(task.id, timeout=0.1, poll_initial=10)
        assert any("again" in r.getMessage() for r in caplog.records if r.name == WAIT_LOGGER)
        # A new outage is a new warning.
        with sleeper(lambda n: outage.begin() if n == 1 else None):
            with pytest.raises(TaskTimeout):
                cairnq_django.wait(task.id, timeout=0.3, poll_initial=10)
    assert len(wait_warnings(caplog)) == 2


def test_a_failure_found_right_after_an_outage_still_ends_it(outage, caplog):
    """The first probe after the outage raises TaskFailed; the next outage warns again."""
    from cairnq_django import TaskFailed

    task = cairnq_django.enqueue("bounce")
    other = cairnq_django.enqueue("nobody_handles_this", queue="elsewhere")

    def plan(n):
        if n == 1:
            outage.begin()
        elif n == 3:
            outage.end()
            get_leases().claim(queues=["default"], worker_id="w")
            get_leases().fail(task.id, "w", "it bounced", retryable=False)

    with caplog.at_level(logging.INFO, logger=WAIT_LOGGER):
        with sleeper(plan), pytest.raises(TaskFailed):
            cairnq_django.wait(task.id, timeout=60, poll_max=50)
        assert waiting._down_since == {}
        with sleeper(lambda n: outage.begin() if n == 1 else None):
            with pytest.raises(TaskTimeout, match="unreachable"):
                cairnq_django.wait(other.id, timeout=0.3, poll_initial=10)
    assert len(wait_warnings(caplog)) == 2


def test_timeout_after_an_outage_tells_how_long_it_lasted(outage):
    task = cairnq_django.enqueue("nobody_handles_this")

    def plan(n):
        if n == 1:
            outage.begin()
        elif n == 3:
            outage.end()

    with sleeper(plan):
        with pytest.raises(TaskTimeout) as info:
            cairnq_django.wait(task.id, timeout=1, poll_initial=10, poll_max=50)
    assert info.value.snapshot.status == "queued"
    assert "still queued" in str(info.value) and "was unreachable for" in str(info.value)


def test_wait_by_key_on_an_unresolved_key_while_unreachable(outage):
    with sleeper(lambda n: outage.begin() if n == 1 else None):
        with pytest.raises(TaskTimeout) as info:
            cairnq_django.wait_by_key("never-set", timeout=0.3, poll_initial=10)
    assert info.value.task_id == "never-set" and info.value.key == "never-set"
    assert "unreachable" in str(info.value)


def test_an_error_on_a_working_connection_is_not_swallowed(live_store, monkeypatch):
    """Only a broken connection is retried; a bad query (OperationalError too) raises."""
    task = cairnq_django.enqueue("echo")

    def broken_probe(task_id):
        raise OperationalError("no such column: imaginary")

    monkeypatch.setattr(live_store, "get_status", broken_probe)
    with pytest.raises(OperationalError, match="imaginary"):
        waiting.wait(live_store, task_id=task.id, timeout=30)


def test_await_task_rides_out_an_outage(outage, caplog):
    task = cairnq_django.enqueue("echo", {"v": "a"})
    calls = {"n": 0}

    def mend():
        outage.end()
        get_leases().claim(queues=["default"], worker_id="w")
        get_leases().complete(task.id, "w", {"v": "a"})

    class Breaking(Wakeup):
        async def await_done(self, task_id, timeout_s):
            calls["n"] += 1
            # The probes run on Django's thread-sensitive thread: break and mend there.
            if calls["n"] == 1:
                await sync_to_async(outage.begin)()
            elif calls["n"] == 5:
                await sync_to_async(mend)()
            await asyncio.sleep(min(timeout_s, 0.05))
            return False

    async def scenario():
        try:
            return await cairnq_django.await_task(task.id, timeout=60, poll_max=50)
        finally:
            await sync_to_async(connections.close_all)()

    with wakeup.use_wakeup("default", Breaking()):
        with caplog.at_level(logging.WARNING, logger=WAIT_LOGGER):
            done = asyncio.run(scenario())
    assert done.result == {"v": "a"} and calls["n"] >= 5
    assert len(wait_warnings(caplog)) == 1


def test_wait_by_key_on_a_key_that_points_at_nothing_reports_the_key(live_store):
    with pytest.raises(TaskTimeout) as info:
        cairnq_django.wait_by_key("nothing-here", timeout=0.1, poll_initial=20)
    error = info.value
    # As the protocol's SDKs do: no id to report, so the key stands in for it.
    assert error.task_id == "nothing-here" and error.key == "nothing-here"
    assert error.snapshot is None and "no such task" in str(error)


def test_await_task_by_key_on_a_key_that_points_at_nothing_reports_the_key(live_store):
    async def scenario():
        try:
            await cairnq_django.await_task_by_key("nothing-async", timeout=0.1, poll_initial=20)
        finally:
            await sync_to_async(connections.close_all)()

    with pytest.raises(TaskTimeout) as info:
        asyncio.run(scenario())
    assert info.value.task_id == "nothing-async" and info.value.key == "nothing-async"


# ------------------------------------------------------- PostgreSQL sessions
def _terminate(*pids: int | None) -> None:
    params = dict(connections["default"].get_connection_params())
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        for pid in pids:
            if pid is not None:
                # Waits (up to 5 s) until the backend is gone.
                admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="needs PostgreSQL sessions"
)
def test_wait_survives_its_session_and_the_listener_being_terminated(live_store, caplog):
    """The server ends the waiter's session and the LISTEN session mid-wait.

    The waiter reconnects, the wakeup listener reconnects on its own, and the
    wait returns the result: a dead LISTEN connection never makes it sleep
    until its timeout.
    """
    task = cairnq_django.enqueue("echo", {"v": 2})
    listener = wakeup.get_wakeup("default")
    assert listener.ready(10), "the LISTEN connection did not come up"
    first_listener_pid = listener.backend_pid

    def plan(n):
        if n == 1:
            _terminate(connections["default"].connection.info.backend_pid, listener.backend_pid)
        elif n == 6:
            get_leases().claim(queues=["default"], worker_id="w")
            get_leases().complete(task.id, "w", {"v": 2})

    with caplog.at_level(logging.WARNING, logger=WAIT_LOGGER), sleeper(plan) as calls:
        done = cairnq_django.wait(task.id, timeout=60, poll_max=50)
    assert done.result == {"v": 2} and calls["n"] >= 6
    assert len(wait_warnings(caplog)) == 1
    # The listener came back on a new session by itself.
    assert listener.ready(10) and listener.backend_pid != first_listener_pid
