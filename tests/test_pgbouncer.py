"""Through PgBouncer in transaction pooling mode: what works, and the listener that cannot.

scripts/test starts the PgBouncer (scripts/lib.sh, ensure_pgbouncer) and
exports its port as CAIRNQ_PGBOUNCER_PORT. In this process the alias
"bouncer" is the test database reached through it; child processes get
tests/settings_pgbouncer.py, whose default alias is the same. Behind such a
pooler LISTEN succeeds and hears nothing: the listener's delivery probe warns
once, and CAIRNQ['LISTEN_DATABASE'] gives it a direct connection.
"""

from __future__ import annotations

import logging
import os
import signal

import pytest
from django.core.checks import Error
from django.db import connections
from django.test import override_settings

from cairnq_django import enqueue, get, wait, wakeup
from cairnq_django.checks import listen_database_errors
from cairnq_django.conformance import load_scenario, run_scenario
from cairnq_django.conformance.runner import clear_tasks
from cairnq_django.store.leases import get_leases
from cairnq_django.wakeup import PostgresWakeup, probe, use_wakeup
from cairnq_django.wakeup.postgres import listen_params, postgres_params
from tests import test_wakeup
from tests.scenario_folder import skip_or_fail_without_scenarios
from tests.test_conformance import _scenario_params
from tests.workerutil import WorkerProcess, run_burst, wait_for

BOUNCER = "bouncer"
POSTGRES = connections["default"].vendor == "postgresql"
only_postgres = pytest.mark.skipif(not POSTGRES, reason="PgBouncer pools PostgreSQL")
WARNING = "did not receive its own test notification"


def bouncer_port() -> str:
    port = os.environ.get("CAIRNQ_PGBOUNCER_PORT")
    if not port or BOUNCER not in connections.settings:
        reason = (
            "No PgBouncer: CAIRNQ_PGBOUNCER_PORT is unset (scripts/test starts one with "
            "ensure_pgbouncer when Debian's pgbouncer is installed or installable)."
        )
        if os.environ.get("CAIRNQ_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return port


def direct_listener() -> str:
    """LISTEN_DATABASE as a connection string: the server itself, past the pooler."""
    default = connections["default"].settings_dict
    return f"host={default['HOST'] or '127.0.0.1'} port={default['PORT'] or 5432}"


# tests/settings.py defines the alias (a mirror of the test database) when
# CAIRNQ_PGBOUNCER_PORT is set; the tests are allowed to use it.
# (Without a PgBouncer the alias is absent and the tests using it skip.)
pytestmark = pytest.mark.django_db(
    transaction=True, databases=["default", *([BOUNCER] if BOUNCER in connections.settings else [])]
)


@pytest.fixture
def bouncer(transactional_db):
    """The alias "bouncer": this test database, through PgBouncer."""
    bouncer_port()
    yield BOUNCER
    connections[BOUNCER].close()
    with connections["default"].cursor() as cursor:
        cursor.execute("DELETE FROM cairnq_task_keys")
        cursor.execute("DELETE FROM cairnq_tasks")


@pytest.fixture
def bouncer_env(child_env, bouncer):
    return dict(child_env, DJANGO_SETTINGS_MODULE="tests.settings_pgbouncer",
                CAIRNQ_PGBOUNCER_PORT=bouncer_port())


@pytest.fixture(scope="module", autouse=True)
def bouncer_lets_go():
    """After the module: PgBouncer drops its server sessions, or the test database cannot be dropped."""
    yield
    port = os.environ.get("CAIRNQ_PGBOUNCER_PORT")
    if not port or not POSTGRES:
        return
    import psycopg

    settings = connections["default"].settings_dict
    # The admin console (admin_users in lib.sh's pgbouncer.ini) takes simple queries only.
    with psycopg.connect(host="127.0.0.1", port=port, dbname="pgbouncer", user=settings["USER"],
                         autocommit=True) as admin:
        for command in (f"KILL {settings['NAME']}", f"RESUME {settings['NAME']}"):
            admin.pgconn.exec_(command.encode())


@pytest.fixture(autouse=True)
def fresh_warnings():
    probe.forget_warnings()
    yield
    probe.forget_warnings()


# ------------------------------------------------------------ the protocol
@only_postgres
@pytest.mark.parametrize(("path", "problem"), _scenario_params())
def test_scenario_through_pgbouncer(bouncer, path, problem):
    if path is None:
        skip_or_fail_without_scenarios()
    store = get_leases(bouncer)
    clear_tasks(store)
    result = run_scenario(store, load_scenario(path))
    assert result.passed, str(result)


@only_postgres
def test_worker_drains_through_pgbouncer(bouncer, bouncer_env):
    tasks = [enqueue("tests.orm_write", using=bouncer) for _ in range(150)]
    tasks += [enqueue("tests.echo", {"n": n}, using=bouncer) for n in range(150)]
    out = run_burst(bouncer_env, "--concurrency", "8")
    assert {get(t.id).status for t in tasks} == {"succeeded"}, out
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM auth_group WHERE name LIKE 'pool-%%'")
        assert cursor.fetchone()[0] == 150


# ------------------------------------------------------------ the listener
@only_postgres
def test_a_listener_behind_pgbouncer_warns_once_naming_the_fix(bouncer, caplog, monkeypatch):
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 1.0)
    caplog.set_level(logging.WARNING, logger="cairnq_django.wakeup")
    first = wakeup.build_wakeup(bouncer)
    second = wakeup.build_wakeup(bouncer)  # as a reconnect would: it probes again
    try:
        assert isinstance(first, PostgresWakeup) and first.ready(30) and second.ready(30)
        wait_for(lambda: first.delivering is False and second.delivering is False, timeout=30,
                 message="the probes were never judged")
        # What the probe stands for: a real enqueue through the pooler wakes nobody.
        enqueue("wake.unheard", queue="unheard", using=bouncer)
        assert first.wait_for_queued(["unheard"], 2.0) is False
    finally:
        first.close()
        second.close()
    warnings = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "PgBouncer" in warnings[0] and "LISTEN_DATABASE" in warnings[0]


@only_postgres
def test_a_direct_listener_hears_what_is_sent_through_pgbouncer(bouncer, caplog):
    caplog.set_level(logging.WARNING, logger="cairnq_django.wakeup")
    with override_settings(CAIRNQ={"LISTEN_DATABASE": direct_listener()}):
        assert listen_params(bouncer)["port"] != postgres_params(bouncer)["port"]
        heard = wakeup.build_wakeup(bouncer)
    try:
        assert heard.ready(30)
        wait_for(lambda: heard.delivering is not None, timeout=30, message="no probe answer")
        assert heard.delivering is True
        waiter = test_wakeup.start_waiting(heard, 1, heard.wait_for_queued, ["heard"], 60.0)
        enqueue("wake.heard", queue="heard", using=bouncer)
        assert waiter.outcome() is True
    finally:
        heard.close()
    assert not [r for r in caplog.records if WARNING in r.getMessage()]


@only_postgres
def test_a_listener_that_hears_its_probe_says_nothing(live_store, caplog):
    caplog.set_level(logging.WARNING, logger="cairnq_django.wakeup")
    direct = wakeup.build_wakeup("default")
    try:
        assert direct.ready(30)
        wait_for(lambda: direct.delivering is not None, timeout=30, message="no probe answer")
        assert direct.delivering is True
    finally:
        direct.close()
    assert not [r for r in caplog.records if WARNING in r.getMessage()]


@only_postgres
def test_wait_through_pgbouncer_with_a_direct_listener(bouncer, bouncer_env):
    settings = {"LISTEN_DATABASE": direct_listener()}
    worker = WorkerProcess(bouncer_env, "-v", "2", settings=settings)
    try:
        with override_settings(CAIRNQ=settings):
            for n in range(5):
                task = enqueue("tests.echo", {"n": n}, using=bouncer)
                assert wait(task.id, timeout=60, using=bouncer).result["echo"] == {"n": n}
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
        out = worker.output()
    finally:
        worker.stop()
    assert WARNING not in out, out


@only_postgres
def test_a_worker_behind_pgbouncer_warns_and_still_drains(bouncer, bouncer_env):
    worker = WorkerProcess(bouncer_env, "-v", "2")
    try:
        wait_for(lambda: WARNING in worker.output(), timeout=60,
                 message="the worker never warned about its deaf listener")
        task = enqueue("tests.echo", {"late": True}, using=bouncer)
        # Picked up by polling: slower, never lost.
        assert wait(task.id, timeout=60, using=bouncer).status == "succeeded"
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0
        out = worker.output()
    finally:
        worker.stop()
    assert out.count(WARNING) == 1, out
    assert "LISTEN_DATABASE" in out


# ------------------------------------------------------------ the setting's check
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@pytest.mark.parametrize(("value", "ok"), [
    (None, True), ("direct", True), ("host=db.internal port=5432", True),
    ("postgresql://u@db.internal:5432/app", True),
    ("lite", False), ("no-such-alias", False), (5432, False), ("", False),
])
def test_listen_database_is_checked(value, ok):
    databases = {"default": {"ENGINE": "django.db.backends.postgresql"},
                 "direct": {"ENGINE": "django.db.backends.postgresql"},
                 "lite": {"ENGINE": "django.db.backends.sqlite3"}}
    # Only the settings are read; nothing connects.
    with override_settings(DATABASES=databases, CAIRNQ={"LISTEN_DATABASE": value}):
        found = listen_database_errors("default")
    assert (found == []) is ok, found
    assert all(isinstance(e, Error) and e.id == "cairnq.E014" for e in found)


# ------------------------------------------------------------ the wakeup suite
# tests/test_wakeup.py's PostgreSQL tests again, with their producers (the
# child processes) through PgBouncer and the listener direct, via LISTEN_DATABASE.
@pytest.fixture
def child_env(transactional_db, bouncer):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings_pgbouncer",
               CAIRNQ_PGBOUNCER_PORT=bouncer_port())
    env["CAIRNQ_CHILD_DB_NAME"] = str(connections["default"].settings_dict["NAME"])
    return env


@pytest.fixture
def wake(live_store, bouncer):
    with override_settings(CAIRNQ={"LISTEN_DATABASE": direct_listener()}):
        w = PostgresWakeup(listen_params(bouncer), probe_alias=bouncer)
    with use_wakeup("default", w):
        assert w.ready(30), "the wakeup never started listening"
        yield w
    w.close()


for _name in (
    "test_queued_wake_arrives_when_another_process_enqueues",
    "test_work_committed_between_two_waits_is_not_slept_through",
    "test_a_finish_between_two_waits_is_not_slept_through",
    "test_done_wake_arrives_when_another_process_finishes_the_task",
    "test_waits_time_out_when_nothing_happens",
    "test_wait_is_woken_by_the_done_signal",
    "test_await_task_is_woken_by_the_done_signal",
    "test_coroutines_and_threads_wait_side_by_side",
    "test_listener_reconnects_after_its_backend_is_killed",
):
    globals()[_name.replace("test_", "test_through_pgbouncer_", 1)] = only_postgres(
        getattr(test_wakeup, _name)
    )
