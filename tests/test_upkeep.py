"""The worker's VACUUM of the queue table after enough claims (worker/upkeep.py, issue 31)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from django.db import connections

from cairnq_django import enqueue_many
from cairnq_django.worker.upkeep import MIN_CLAIMS, ROWS_PER_CLAIM, TableUpkeep, claims_between

postgres_only = pytest.mark.skipif(
    "connections['default'].vendor != 'postgresql'", reason="only PostgreSQL needs the VACUUM"
)


def _vacuums() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'cairnq_tasks'::regclass"
        )
        return int(cursor.fetchone()[0])


class Reports(list):
    def __call__(self, exc, **context):
        self.append((exc, context))


def test_the_interval_grows_with_the_table():
    assert claims_between(0) == MIN_CLAIMS
    assert claims_between(MIN_CLAIMS * ROWS_PER_CLAIM) == MIN_CLAIMS
    assert claims_between(1_000_000) == max(MIN_CLAIMS, 1_000_000 // ROWS_PER_CLAIM)
    assert claims_between(10_000_000) == 100_000


@pytest.mark.skipif(
    "connections['default'].vendor == 'postgresql'", reason="SQLite has no dead index entries"
)
def test_sqlite_never_vacuums(live_store):
    upkeep = TableUpkeep(live_store, Reports())
    assert not upkeep.enabled
    upkeep.claimed(10 * MIN_CLAIMS)
    assert not upkeep.running and upkeep._thread is None


@postgres_only
def test_enough_claims_vacuum_the_table_on_a_thread_of_their_own(live_store):
    enqueue_many([("tests.echo", {}) for _ in range(3)])
    reports = Reports()
    upkeep = TableUpkeep(live_store, reports)
    assert upkeep.enabled
    upkeep.interval = 3
    before = _vacuums()
    claimed = live_store.claim(queues=["default"], worker_id="w", limit=2)
    upkeep.claimed(len(claimed))
    assert upkeep._thread is None  # 2 of 3: not yet
    claimed += live_store.claim(queues=["default"], worker_id="w", limit=2)
    upkeep.claimed(len(claimed) - 2)
    assert upkeep._thread is not None
    upkeep.join(60)
    assert not upkeep.running
    assert reports == []
    assert _vacuums() == before + 1
    # The next interval comes from the row estimate the VACUUM left.
    assert upkeep.interval == MIN_CLAIMS


@postgres_only
def test_a_role_that_may_not_vacuum_is_told_once_and_stops_trying(live_store, caplog):
    role = f"{connections['default'].settings_dict['NAME']}_not_owner"
    with connections["default"].cursor() as cursor:
        cursor.execute(f'DROP ROLE IF EXISTS "{role}"')
        cursor.execute(f'CREATE ROLE "{role}"')
        cursor.execute(f'GRANT SELECT ON cairnq_meta, cairnq_tasks TO "{role}"')
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute(f'SET ROLE "{role}"')
        try:
            assert live_store.vacuum_tasks() is None
        finally:
            with connections["default"].cursor() as cursor:
                cursor.execute("RESET ROLE")
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute(f'REVOKE ALL ON cairnq_meta, cairnq_tasks FROM "{role}"')
            cursor.execute(f'DROP ROLE "{role}"')

    not_allowed = SimpleNamespace(
        using=live_store.using, dialect=live_store.dialect, vacuum_tasks=lambda: None,
    )
    upkeep = TableUpkeep(not_allowed, Reports())
    upkeep.interval = 1
    with caplog.at_level(logging.WARNING, logger="cairnq_django.worker"):
        upkeep.claimed(1)
        upkeep.join(60)
        upkeep.claimed(5)
    assert not upkeep.enabled and not upkeep.running
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "may not VACUUM" in caplog.records[0].message


@postgres_only
def test_the_migration_gives_the_queue_table_its_autovacuum_settings(db):
    from cairnq_django.db.dialects import POSTGRES

    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'cairnq_tasks'::regclass")
        options = set(cursor.fetchone()[0] or ())
    assert options == {f"{name}={value}" for name, value in POSTGRES.queue_table_storage}
