import os

import pytest
from django.db import connections

from cairnq_django.store.leases import get_leases

CAIRNQ_TABLES = ("cairnq_task_keys", "cairnq_tasks")


@pytest.fixture
def store(db):
    """The store's lease part (which submits and reads too) on the test database, in its transaction."""
    return get_leases("default")


@pytest.fixture
def live_store(transactional_db):
    """The store with real commits (for tests that use other processes).

    Cleared here as well as by Django's flush, so a test that fails midway
    leaves no tasks for the next one even where flush is inhibited.
    """
    yield get_leases("default")
    with connections["default"].cursor() as cursor:
        for table in CAIRNQ_TABLES:
            cursor.execute(f"DELETE FROM {table}")


@pytest.fixture
def child_env(transactional_db):
    """Environment for a child process that must open the same test database."""
    env = dict(os.environ)
    env["CAIRNQ_CHILD_DB_NAME"] = str(connections["default"].settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    return env


@pytest.fixture(autouse=True)
def close_wakeups():
    """Close wakeup listeners after each test, so none outlives the test database."""
    yield
    from cairnq_django import wakeup

    wakeup.close_all()


@pytest.fixture
def runs_table(live_store):
    """The worker_test_runs table that tests.testapp handlers record their runs in."""
    # Imported here: tests.workerutil imports tests.testapp.tasks, whose @task
    # registrations must not happen as a side effect of loading this conftest.
    from tests.workerutil import create_runs_table, drop_runs_table

    create_runs_table()
    yield
    drop_runs_table()
