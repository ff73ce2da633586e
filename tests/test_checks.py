"""System checks: every cairnq.* id, and what `manage.py check` prints."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.checks import Error
from django.core.checks import Warning as CheckWarning
from django.test import override_settings

from cairnq_django.checks import check_database, check_settings
from cairnq_django.retention import RetentionSweeper

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def ids(messages):
    return sorted(message.id for message in messages)


def run_checks(cairnq=None, databases=None, routers=None):
    overrides = {"CAIRNQ": cairnq if cairnq is not None else {}}
    if databases is not None:
        overrides["DATABASES"] = databases
    if routers is not None:
        overrides["DATABASE_ROUTERS"] = routers
    with override_settings(**overrides):
        return check_settings() + check_database()


def sqlite_db(**options):
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3", "OPTIONS": options}


GOOD_SQLITE = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
}


def test_the_test_settings_pass():
    assert run_checks() == []


@pytest.mark.parametrize(
    "cairnq, expected",
    [
        ({"DATABASE": "default", "MAX_QUEUE_DEPTH": {"a": 5, "*": 10}, "MAX_QUEUE_WAIT":
          timedelta(seconds=2), "QUEUES": ["a", "b"], "CONCURRENCY": 4, "MAX_RUN": None,
          "ON_ERROR": "logging.exception", "RETENTION": {"succeeded": timedelta(days=1)}}, []),
        ({"QUEUS": ["a"]}, ["cairnq.E002"]),
        ({"LEASE": -5}, ["cairnq.E003"]),
        ({"MAX_QUEUE_WAIT": "5s"}, ["cairnq.E003"]),
        ({"WAIT_POLL_MAX": None}, ["cairnq.E003"]),
        ({"WAIT_POLL_INITIAL": 0}, ["cairnq.E003"]),
        ({"WAIT_POLL_MAX": timedelta(0)}, ["cairnq.E003"]),
        ({"MAX_QUEUE_DEPTH": 0}, ["cairnq.E004"]),
        ({"MAX_QUEUE_DEPTH": {"a": "ten"}}, ["cairnq.E004"]),
        ({"MAX_QUEUE_DEPTH": True}, ["cairnq.E004"]),
        ({"CONCURRENCY": 0}, ["cairnq.E005"]),
        ({"SWEEP_BATCH_SIZE": 2.5}, ["cairnq.E005"]),
        ({"LISTENERS": 0}, ["cairnq.E005"]),
        ({"LISTENERS": "2"}, ["cairnq.E005"]),
        ({"LISTENERS": None}, []),
        ({"LISTENERS": 3}, []),
        ({"QUEUES": []}, ["cairnq.E006"]),
        ({"QUEUES": "default"}, ["cairnq.E006"]),
        ({"QUEUES": ["ok", ""]}, ["cairnq.E006"]),
        ({"ON_ERROR": "no.such.module.hook"}, ["cairnq.E007"]),
        ({"ON_ERROR": "cairnq_django.conf.DEFAULTS"}, ["cairnq.E007"]),
        ({"RETENTION": {}}, ["cairnq.E020"]),
        ({"RETENTION": {"queued": 1000}}, ["cairnq.E020"]),
    ],
)
def test_settings_checks(cairnq, expected):
    assert ids(run_checks(cairnq)) == expected


@pytest.mark.parametrize("value", [True, 0, -1, 2.5, "3", 1, 500])
def test_the_check_refuses_exactly_the_batch_sizes_the_sweeper_refuses(value):
    """Both ask validators' one positive-integer test, so check and runtime cannot disagree."""
    reported = ids(run_checks({"SWEEP_BATCH_SIZE": value})) == ["cairnq.E005"]
    try:
        RetentionSweeper(rules=1000, batch_size=value)
    except ValueError:
        refused = True
    else:
        refused = False
    assert reported == refused


@pytest.mark.parametrize(
    "limits, expected",
    [
        ([{"name": "reports.generate", "concurrency": 3},
          {"queue": "partner", "rate": 20, "per": timedelta(seconds=1)},
          {"key_prefix": "account:", "concurrency": 1, "rate": 1000, "per": 3_600_000}], []),
        ([], []),
        ({"name": "x", "concurrency": 1}, ["cairnq.E040"]),
        (["name"], ["cairnq.E040"]),
        ([{"concurrency": 1}], ["cairnq.E040"]),
        ([{"name": "x", "queue": "y", "concurrency": 1}], ["cairnq.E040"]),
        ([{"name": "x"}], ["cairnq.E040"]),
        ([{"name": "", "concurrency": 1}], ["cairnq.E040"]),
        ([{"name": "x", "concurrency": 0}], ["cairnq.E040"]),
        ([{"name": "x", "concurrency": "3"}], ["cairnq.E040"]),
        ([{"name": "x", "rate": -1}], ["cairnq.E040"]),
        ([{"name": "x", "rate": 5, "per": 0}], ["cairnq.E040"]),
        ([{"name": "x", "rate": 5, "per": "1s"}], ["cairnq.E040"]),
        ([{"name": "x", "concurrency": 1, "per": 1000}], ["cairnq.E040"]),
        ([{"name": "x", "concurrency": 1, "burst": 2}], ["cairnq.E040"]),
        ([{"name": "x", "concurrency": 1}, {"name": "x", "rate": 2}], ["cairnq.E041"]),
        ([{"name": "x", "concurrency": 1}, {"queue": "x", "concurrency": 1}], []),
    ],
)
def test_limits_checks(limits, expected):
    assert ids(run_checks({"LIMITS": limits})) == expected


def test_a_limit_error_names_the_entry_and_what_is_wrong():
    [error] = run_checks({"LIMITS": [{"name": "a", "concurrency": 1}, {"queue": "b", "concurrency": 0}]})
    assert "settings.CAIRNQ['LIMITS'][1]" in error.msg
    assert "concurrency must be a positive integer" in error.msg
    assert "key_prefix" in error.hint


def test_settings_must_be_a_dict():
    with override_settings(CAIRNQ=["DATABASE", "default"]):
        assert ids(check_settings() + check_database()) == ["cairnq.E001"]


def test_messages_are_sentences_with_hints():
    [error] = run_checks({"QUEUS": ["a"]})
    assert isinstance(error, Error) and error.msg.endswith(".") and "QUEUES" in error.hint


def test_unknown_database_alias():
    [error] = run_checks({"DATABASE": "queue"})
    assert error.id == "cairnq.E010" and "'queue'" in error.msg and "default" in error.hint


def test_unsupported_database_engine():
    databases = {"default": {"ENGINE": "django.db.backends.mysql", "NAME": "x"}}
    assert ids(run_checks(databases=databases)) == ["cairnq.E011"]


def test_postgres_needs_no_options():
    databases = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}}
    assert run_checks(databases=databases) == []


def test_sqlite_with_the_recommended_options_passes():
    assert run_checks(databases={"default": sqlite_db(**GOOD_SQLITE)}) == []


def test_sqlite_without_immediate_transactions_is_an_error():
    options = {k: v for k, v in GOOD_SQLITE.items() if k != "transaction_mode"}
    messages = run_checks(databases={"default": sqlite_db(**options)})
    assert ids(messages) == ["cairnq.E012"]
    assert "transaction_mode" in messages[0].hint and "IMMEDIATE" in messages[0].hint
    deferred = dict(GOOD_SQLITE, transaction_mode="DEFERRED")
    assert ids(run_checks(databases={"default": sqlite_db(**deferred)})) == ["cairnq.E012"]
    lowercase = dict(GOOD_SQLITE, transaction_mode="immediate")
    assert run_checks(databases={"default": sqlite_db(**lowercase)}) == []


def test_sqlite_exclusive_transactions_pass_like_immediate():
    for mode in ("EXCLUSIVE", "exclusive"):
        exclusive = dict(GOOD_SQLITE, transaction_mode=mode)
        assert run_checks(databases={"default": sqlite_db(**exclusive)}) == []


def test_begin_exclusive_takes_the_write_lock_at_begin_and_lets_wal_readers_read(tmp_path):
    """Why E012 accepts EXCLUSIVE: a second writer cannot start, a reader still can."""
    import sqlite3

    path = tmp_path / "exclusive.sqlite3"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (n integer)")
    setup.execute("INSERT INTO t VALUES (1)")
    setup.close()
    writer = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        writer.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        assert other.execute("SELECT n FROM t").fetchall() == [(1,)]
        writer.execute("ROLLBACK")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        writer.close()
        other.close()


def test_sqlite_without_wal_warns():
    options = dict(GOOD_SQLITE, init_command="PRAGMA synchronous=NORMAL")
    [warning] = run_checks(databases={"default": sqlite_db(**options)})
    assert isinstance(warning, CheckWarning) and warning.id == "cairnq.W013"


@pytest.mark.parametrize("timeout", [1, "20"])
def test_sqlite_with_a_short_busy_timeout_warns(timeout):
    options = dict(GOOD_SQLITE, timeout=timeout)
    assert ids(run_checks(databases={"default": sqlite_db(**options)})) == ["cairnq.W014"]


def test_a_busy_timeout_that_is_not_a_number_is_named_as_such():
    [warning] = run_checks(databases={"default": sqlite_db(**dict(GOOD_SQLITE, timeout="20"))})
    assert warning.msg == (
        "SQLite database 'default' has OPTIONS['timeout'] = '20', which is not a number of seconds."
    )


def test_an_sqlite_library_without_returning_is_an_error(monkeypatch):
    import cairnq_django.checks as checks

    monkeypatch.setattr(checks.sqlite3, "sqlite_version_info", (3, 34, 1))
    monkeypatch.setattr(checks.sqlite3, "sqlite_version", "3.34.1")
    [error] = run_checks(databases={"default": sqlite_db(**GOOD_SQLITE)})
    assert error.id == "cairnq.E013" and "3.34.1" in error.msg and "3.35.0" in error.msg
    # Postgres does not care which SQLite Python links.
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "x"}
    assert run_checks(databases={"default": postgres}) == []


def test_sqlite_defaults_report_everything():
    # Python's sqlite3 waits 5 s by default, which is just enough not to warn.
    assert ids(run_checks(databases={"default": sqlite_db()})) == ["cairnq.E012", "cairnq.W013"]


def test_only_the_queue_alias_is_checked():
    databases = {"default": sqlite_db(), "queue": sqlite_db(**GOOD_SQLITE)}
    assert run_checks(
        {"DATABASE": "queue"}, databases, routers=["cairnq_django.routers.CairnQRouter"]
    ) == []


def test_a_separate_queue_database_without_the_router_warns():
    databases = {"default": sqlite_db(**GOOD_SQLITE), "queue": sqlite_db(**GOOD_SQLITE)}
    assert ids(run_checks({"DATABASE": "queue"}, databases, routers=[])) == ["cairnq.W015"]
    from cairnq_django.routers import CairnQRouter

    assert run_checks({"DATABASE": "queue"}, databases, routers=[CairnQRouter()]) == []


def manage_py_check(tmp_path, options: dict) -> subprocess.CompletedProcess:
    """Run `django-admin check` with the test settings and SQLite OPTIONS replaced."""
    module = tmp_path / "check_settings.py"
    module.write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa
            DATABASES = {{"default": {{
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": {str(tmp_path / "db.sqlite3")!r},
                "OPTIONS": {options!r},
            }}}}
            """
        )
    )
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "DJANGO_SETTINGS_MODULE": "check_settings"}
    import os

    env = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def test_manage_py_check_reports_missing_immediate(tmp_path):
    options = {k: v for k, v in GOOD_SQLITE.items() if k != "transaction_mode"}
    proc = manage_py_check(tmp_path, options)
    assert proc.returncode == 1
    assert "cairnq.E012" in proc.stderr
    assert "BEGIN IMMEDIATE" in proc.stderr
    assert "transaction_mode" in proc.stderr


def test_manage_py_check_is_clean_with_the_documented_settings(tmp_path):
    proc = manage_py_check(tmp_path, GOOD_SQLITE)
    assert proc.returncode == 0, proc.stderr
    assert "no issues" in proc.stdout
