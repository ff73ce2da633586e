"""The same store cases through both engines (store/postgres_engine.py).

On PostgreSQL each case runs twice: through the PostgreSQL engine (the
claim and recovery in one query string, the limited claim's lock, recovery
and counts in one, a large batch through COPY) and through the generic
engine, built explicitly, which runs the statements one by one as SQLite
does. On SQLite the generic engine runs them. Each case also checks which
path it took, from the statements Django's cursor ran, so a variant that
silently fell back to the generic path fails here.

Real commits (transactional_db): the claim's variant runs only outside a
caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connections, transaction

from cairnq_django import Limit
from cairnq_django.conformance import ConformanceError, load_scenario, run_scenario, scenario_files
from cairnq_django.models import TaskAttempt
from cairnq_django.store.leases import LeaseOperations
from cairnq_django.store.postgres_engine import COPY_MIN_ROWS, GenericEngine, PostgresEngine
from cairnq_django.store.sql import LIMITED_CLAIM_LOCK

from .scenario_folder import scenario_dir, skip_or_fail_without_scenarios
from .storeutil import expire_lease

POSTGRES = connections["default"].vendor == "postgresql"
ENGINES = ["postgres", "generic"] if POSTGRES else ["generic"]


@pytest.fixture(params=ENGINES)
def variants(request) -> bool:
    """Does this run take the PostgreSQL engine's variants (else the generic engine's path)?"""
    return request.param == "postgres"


@pytest.fixture
def leases(variants, live_store):
    """The lease part over the engine under test; `live_store` empties the tables afterwards."""
    return LeaseOperations("default", PostgresEngine if variants else lambda _: GenericEngine())


@contextmanager
def statements() -> Iterator[list[str]]:
    """The SQL Django's cursor runs on the queue's tables while the block runs (COPY's data aside).

    Transaction control (SQLite's BEGIN IMMEDIATE, savepoints) is left out.
    """
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        if "cairnq_" in sql:
            seen.append(sql)
        return execute(sql, params, many, context)

    with connections["default"].execute_wrapper(wrapper):
        yield seen


def statuses() -> dict[str, int]:
    rows = raw_rows("SELECT status, count(*) FROM cairnq_tasks GROUP BY status")
    return {status: int(count) for status, count in rows}


def raw_rows(statement: str, params=None) -> list[tuple]:
    with connections["default"].cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.fetchall()


# ------------------------------------------------------------------ the claim
def test_a_claim_takes_the_highest_priorities_under_a_lease(leases, variants):
    low = leases.submit("job", priority=0)
    high = leases.submit("job", priority=9)
    mid = leases.submit("job", priority=5)
    with statements() as seen:
        claimed = leases.claim(queues=["default"], worker_id="w1", lease_ms=60_000, limit=2)
    assert [task.id for task in claimed] == [high.id, mid.id]
    for task in claimed:
        assert task.status == "running" and task.worker_id == "w1" and task.attempt == 1
        assert task.lease_until_ms >= task.updated_at_ms + 60_000 - 1_000
    assert leases.get(low.id).status == "queued"
    assert statuses() == {"running": 2, "queued": 1}
    # The PostgreSQL engine sends the recovery and the claim as one query.
    assert len(seen) == (1 if variants else 2)
    assert ("; " in seen[0]) is variants


def test_a_claim_recovers_an_expired_lease_and_takes_the_task_again(leases, variants):
    task = leases.submit("job", max_attempts=3)
    last = leases.submit("other", max_attempts=1)
    [first] = leases.claim(queues=["default"], worker_id="w1", names=["job"])
    [only] = leases.claim(queues=["default"], worker_id="w1", names=["other"])
    assert (first.id, only.id) == (task.id, last.id)
    expire_lease(leases, task.id)
    expire_lease(leases, last.id)
    with statements() as seen:
        [again] = leases.claim(queues=["default"], worker_id="w2", names=["job"], limit=5)
    # Recovered in the claim's own query; the lost attempts' rows follow (PostgreSQL engine).
    assert ("; " in seen[0]) is variants
    assert again.id == task.id and again.worker_id == "w2" and again.attempt == 2
    # The last attempt's expired lease fails the task instead of requeuing it.
    failed = leases.get(last.id)
    assert failed.status == "failed" and failed.error["code"] == "lease_expired"
    lost = sorted(TaskAttempt.objects.filter(outcome="lost").values_list("task_id", "attempt"))
    assert lost == sorted([(task.id, 1), (last.id, 1)])
    assert statuses() == {"running": 1, "failed": 1}


def test_a_claim_inside_the_callers_transaction_takes_the_generic_path(leases):
    task = leases.submit("job")
    with statements() as seen, transaction.atomic():
        [claimed] = leases.claim(queues=["default"], worker_id="w1")
    assert claimed.id == task.id and claimed.status == "running"
    assert len(seen) == 2 and not any("; " in sql for sql in seen)


# ------------------------------------------------------------ the limited claim
def test_a_limited_claim_holds_a_name_to_its_concurrency(leases, variants):
    limits = [Limit("name", "slow", 2, None, None, "settings")]
    slow = [leases.submit("slow").id for _ in range(5)]
    fast = [leases.submit("fast").id for _ in range(3)]

    def claim(worker):
        return leases.claim_limited(limits=limits, queues=["default"], worker_id=worker, limit=10)

    with statements() as seen:
        first = claim("w1")
    assert sorted(task.name for task in first.tasks) == ["fast"] * 3 + ["slow"] * 2
    assert first.held == 3
    assert {task.id for task in first.tasks} >= set(fast)
    # The PostgreSQL engine reads lock, recovery, counts and candidates in one query.
    assert any(text.startswith(LIMITED_CLAIM_LOCK + "; ") for text in seen) is variants
    second = claim("w2")
    assert second.tasks == [] and second.held == 3
    # A slot frees when a lease expires: the next claim recovers it and takes one.
    running = [task for task in first.tasks if task.name == "slow"]
    expire_lease(leases, running[0].id)
    third = claim("w3")
    assert [task.name for task in third.tasks] == ["slow"] and third.tasks[0].worker_id == "w3"
    assert third.tasks[0].id in slow
    assert raw_rows(
        "SELECT count(*) FROM cairnq_tasks WHERE name = 'slow' AND status = 'running'"
    ) == [(2,)]
    assert statuses() == {"running": 5, "queued": 3}


# ------------------------------------------------------------------ bulk insert
@pytest.mark.parametrize("count", [3, COPY_MIN_ROWS + 5])
def test_a_batch_reads_back_as_written(leases, variants, count):
    specs = [
        leases.prepare(f"bulk{i % 2}", {"i": i, "text": "tab\there"}, priority=i % 4,
                       metadata={"n": i} if i % 3 == 0 else None)
        for i in range(count)
    ]
    with statements() as seen:
        written = leases.submit_many(specs)  # in a transaction of its own, where COPY may run
    assert [task.id for task in written] == [spec["id"] for spec in specs]
    assert raw_rows("SELECT count(*) FROM cairnq_tasks WHERE status = 'queued'") == [(count,)]
    for task in written[:3] + written[-3:]:
        stored = leases.get(task.id)
        assert (stored.name, stored.payload, stored.priority, stored.metadata) == (
            task.name, task.payload, task.priority, task.metadata
        )
        assert stored.created_at_ms == task.created_at_ms
    copied = variants and count >= COPY_MIN_ROWS
    # COPY runs behind Django's cursor: no INSERT statement goes through it.
    assert (not any(sql.startswith("INSERT INTO \"cairnq_tasks\"") for sql in seen)) is copied


# ------------------------------------------------------ the conformance scenarios
def _scenarios():
    try:
        return [pytest.param(path, id=path.stem) for path in scenario_files(scenario_dir())]
    except ConformanceError:
        # test_conformance.py reports a missing folder; here one case says so too.
        return [pytest.param(None, id="scenario-folder-missing")]


@pytest.mark.parametrize("path", _scenarios())
def test_a_conformance_scenario_passes(leases, path):
    """The shared scenarios with real commits, so the PostgreSQL engine's claim runs too."""
    if path is None:
        skip_or_fail_without_scenarios()
    result = run_scenario(leases, load_scenario(path))
    assert result.passed, str(result)
