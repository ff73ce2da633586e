"""The queue in its own database: CairnQRouter, settings.CAIRNQ['DATABASE'], using=, on_commit.

These tests need two more database aliases, so they run under
tests.settings_multidb; under the ordinary settings a single test re-runs this
file in a child pytest with those settings.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connections, transaction

import cairnq_django
from cairnq_django.routers import CairnQRouter
from cairnq_django.schema import create_or_adopt_tables, install_protocol_objects
from cairnq_django.store import get_store

MULTIDB = "queue" in settings.DATABASES
need_multidb = pytest.mark.skipif(not MULTIDB, reason="runs under tests.settings_multidb")
ALL = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.mark.skipif(MULTIDB, reason="this is the launcher for the multidb run")
def test_multidb_suite_passes_under_its_own_settings():
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings_multidb"
    # Its own Postgres test databases, so it never collides with this run's.
    env["CAIRNQ_PG_TEST_NAME"] = env.get("CAIRNQ_PG_TEST_NAME", "test_cairnq_django") + "_mdb"
    env.pop("CAIRNQ_SQLITE_TEST_FILE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--ds", "tests.settings_multidb", __file__],
        cwd=settings.BASE_DIR if hasattr(settings, "BASE_DIR") else os.getcwd(),
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def tables(alias: str) -> set[str]:
    return set(connections[alias].introspection.table_names())


def count(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_tasks")
        return cursor.fetchone()[0]


@pytest.fixture
def extra():
    """Give the unrouted "extra" alias CairnQ tables by hand, and clean all aliases after."""
    from django.apps import apps

    with connections["extra"].schema_editor() as editor:
        create_or_adopt_tables(apps, editor)  # the second time round, verifies them
        install_protocol_objects(apps, editor)
    yield "extra"
    for alias in ("queue", "extra"):
        with connections[alias].cursor() as cursor:
            cursor.execute("DELETE FROM cairnq_task_keys")
            cursor.execute("DELETE FROM cairnq_tasks")


@need_multidb
@ALL
def test_migrate_puts_the_queue_tables_only_in_the_queue_database():
    assert {"cairnq_tasks", "cairnq_task_keys", "cairnq_meta", "cairnq_migrations"} <= tables(
        "queue"
    )
    assert not {t for t in tables("default") if t.startswith("cairnq")}
    # ... and nothing else goes there.
    assert "auth_user" in tables("default") and "auth_user" not in tables("queue")
    # (sqlite_stat1 holds the planner statistics the migration gathers.)
    assert not {
        t for t in tables("queue") if not t.startswith(("cairnq", "django_migrations", "sqlite_stat"))
    }


@need_multidb
@ALL
def test_enqueue_goes_to_the_configured_alias(extra):
    task = cairnq_django.enqueue("mdb.send", {"to": "a"})
    assert get_store("queue").get(task.id) is not None
    assert count("queue") == 1 and count("extra") == 0
    assert cairnq_django.get(task.id) == get_store("queue").get(task.id)


@need_multidb
@ALL
def test_using_overrides_the_configured_alias(extra):
    task = cairnq_django.enqueue("mdb.send", using="extra")
    assert count("extra") == 1 and count("queue") == 0
    assert cairnq_django.get(task.id, using="extra").id == task.id
    assert cairnq_django.get(task.id) is None
    cairnq_django.enqueue_many([("mdb.bulk", {}), ("mdb.bulk", {})], using="extra")
    assert count("extra") == 3 and count("queue") == 0


@need_multidb
@ALL
def test_orm_reads_are_routed_to_the_queue(extra):
    from cairnq_django.models import Task

    task = cairnq_django.enqueue("mdb.orm")
    assert Task.objects.db == "queue"
    assert list(Task.objects.values_list("id", flat=True)) == [task.id]


@need_multidb
@ALL
def test_plain_enqueue_is_not_atomic_with_the_default_database(extra):
    """Documented limitation: rolling back the app's transaction keeps the task."""
    from django.contrib.auth.models import Group

    with pytest.raises(RuntimeError):
        with transaction.atomic():
            Group.objects.create(name="gone")
            task = cairnq_django.enqueue("mdb.eager")
            raise RuntimeError("abort")
    assert not Group.objects.filter(name="gone").exists()
    assert get_store("queue").get(task.id) is not None


@need_multidb
@ALL
def test_on_commit_waits_for_the_default_transaction(extra):
    from django.contrib.auth.models import Group

    with transaction.atomic():
        Group.objects.create(name="kept")
        pending = cairnq_django.enqueue("mdb.deferred", {"n": 1}, on_commit=True)
        assert count("queue") == 0
    task = get_store("queue").get(pending.id)
    assert task is not None and task.payload == {"n": 1}


@need_multidb
@ALL
def test_on_commit_never_writes_when_the_default_transaction_rolls_back(extra):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            cairnq_django.enqueue("mdb.deferred", on_commit=True)
            cairnq_django.enqueue("mdb.deferred", key="k", on_commit=True, using="extra")
            raise RuntimeError("abort")
    assert count("queue") == 0 and count("extra") == 0


@need_multidb
@ALL
def test_wait_is_refused_only_inside_a_transaction_on_the_queue_alias(extra):
    task = cairnq_django.enqueue("mdb.wait")
    get_store("queue").cancel(task.id)
    with transaction.atomic():  # the default alias: the queue is unaffected
        assert cairnq_django.wait(task.id, raise_on_failure=False).status == "canceled"
    with transaction.atomic(using="queue"):
        with pytest.raises(cairnq_django.CairnQError):
            cairnq_django.wait(task.id)


@need_multidb
def test_database_check_follows_the_setting():
    from django.test import override_settings

    from cairnq_django.checks import check_database

    assert [e.id for e in check_database()] == []
    with override_settings(CAIRNQ={"DATABASE": "nowhere"}):
        assert [e.id for e in check_database()] == ["cairnq.E010"]


def test_router_decisions():
    """The router's answers, independent of which settings run this file."""
    from django.contrib.auth.models import User
    from django.test import override_settings

    from cairnq_django.models import Task

    router = CairnQRouter()
    with override_settings(CAIRNQ={"DATABASE": "queue"}):
        assert router.db_for_read(Task) == router.db_for_write(Task) == "queue"
        assert router.db_for_read(User) is None and router.db_for_write(User) is None
        assert router.allow_migrate("queue", "cairnq_django") is True
        assert router.allow_migrate("default", "cairnq_django", model_name="task") is False
        assert router.allow_migrate("queue", "auth") is False
        assert router.allow_migrate("default", "auth") is None
        assert router.allow_relation(Task(), Task()) is True
        assert router.allow_relation(Task(), User()) is None
    with override_settings(CAIRNQ={}):
        assert router.db_for_write(Task) == "default"
        assert router.allow_migrate("default", "cairnq_django") is True
        assert router.allow_migrate("other", "cairnq_django") is False
        assert router.allow_migrate("default", "auth") is None
