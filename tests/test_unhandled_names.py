"""Due tasks under a name nothing handles: the worker warns once per name; health reports it.

Real worker processes (and a real `cairnq` SDK worker as the peer) on the test
database. The workers table says which names live Django workers handle; a
peer's live lease on (or recent work on) a name says it handles that name.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from cairnq_django import enqueue, get
from cairnq_django.models import WorkerRecord
from cairnq_django.observability.health import check
from cairnq_django.observability.overview import database_now_ms
from tests.peer import sdk_target
from tests.storeutil import shift
from tests.workerutil import ROOT, WorkerProcess, wait_for

pytestmark = pytest.mark.slow

# Presence ticks (and so the check) every 100 ms; a name is due "for long"
# after 3 ticks, and the test's rows were due a minute ago.
FAST_TICKS = {"WORKER_REPORT_INTERVAL": 100}


def _due_a_minute_ago(store, name: str, n: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        task = enqueue(name)
        shift(store, task.id, "run_at_ms", -60_000)
        ids.append(task.id)
    return ids


def _seen_ms(worker_id_prefix: str = "worker_") -> int:
    rows = WorkerRecord.objects.filter(id__startswith=worker_id_prefix)
    return max((r.last_seen_ms for r in rows), default=0)


def _ticks_pass(n: int) -> None:
    """Wait until the worker has recorded itself `n` more times (100 ms apart)."""
    start = _seen_ms()
    wait_for(lambda: _seen_ms() >= start + n * 100, timeout=60,
             message="the worker stopped reporting")


def _fake_live_worker(queues, names):
    now = database_now_ms("default")
    WorkerRecord.objects.create(
        id="worker_elsewhere", host="elsewhere", pid=1, queues=queues, names=names,
        concurrency=1, version="test", started_at_ms=now, last_seen_ms=now,
        interval_ms=3_600_000,
    )


def test_a_worker_warns_once_per_name_nothing_handles(live_store, child_env):
    typo_ids = _due_a_minute_ago(live_store, "tests.send_emial", 3)
    _due_a_minute_ago(live_store, "elsewhere.handled")
    _fake_live_worker(["default"], ["elsewhere.handled"])  # a worker on another host
    worker = WorkerProcess(child_env, "--poll", "50", settings=FAST_TICKS)
    try:
        wait_for(lambda: "Task name 'tests.send_emial'" in worker.output(), timeout=60,
                 message="no warning for the unhandled name")
        _ticks_pass(10)
        out = worker.output()
        assert out.count("Task name 'tests.send_emial'") == 1, out  # rate-limited
        line = next(x for x in out.splitlines() if "Task name 'tests.send_emial'" in x)
        assert "has 3 due task(s) on queue 'default', the oldest due " in line
        assert "no live worker has a handler for it" in line
        assert "(live workers serving that queue run: elsewhere.handled, tests." in line
        assert "@cairnq_django.task" in line and "tasks.py" in line
        assert "'elsewhere.handled'" not in out.replace(line, ""), out
        assert all(get(i).status == "queued" for i in typo_ids)
    finally:
        worker.stop()


_SDK_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from cairnq import Worker

    vendor, target = sys.argv[1:]
    make = Worker.sqlite if vendor == "sqlite" else Worker.postgres
    worker = make(target, queues=["default"], concurrency=1, lease_ms=5000,
                  poll_interval_ms=50)

    @worker.task("peer.slow")
    async def slow(ctx, payload):
        await asyncio.sleep(600)

    async def main():
        async with worker.background():
            await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def test_a_name_a_peer_sdk_worker_runs_is_not_warned_about(live_store, child_env):
    peer_ids = _due_a_minute_ago(live_store, "peer.slow", 3)
    peer = subprocess.Popen(
        [sys.executable, "-c", _SDK_WORKER, connection.vendor, sdk_target()],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        # The peer holds one (with a live lease); the other two wait behind it.
        wait_for(lambda: sum(get(i).status == "running" for i in peer_ids) == 1, timeout=60,
                 message="the SDK worker did not claim")
        _due_a_minute_ago(live_store, "tests.send_emial")  # what a warning looks like
        worker = WorkerProcess(child_env, "--poll", "50", settings=FAST_TICKS)
        wait_for(lambda: "Task name 'tests.send_emial'" in worker.output(), timeout=60,
                 message="no warning for the unhandled name")
        _ticks_pass(10)
        assert "peer.slow" not in worker.output(), worker.output()
    finally:
        peer.kill()
        peer.wait()
        if worker is not None:
            worker.stop()


def test_health_reports_a_name_no_live_worker_handles(live_store):
    _fake_live_worker(["default"], ["tests.echo"])
    _due_a_minute_ago(live_store, "tests.send_emial", 2)
    _due_a_minute_ago(live_store, "tests.echo")
    health = check("default", max_age_ms=3_600_000)
    assert health.code == 1
    [problem] = health.problems
    assert problem.startswith(
        "Queue 'default' has 2 due task(s) named 'tests.send_emial', the oldest due "
    )
    assert problem.endswith("ago, and no live worker has a handler for that name.")


def test_health_counts_a_name_a_live_worker_registered_as_handled(live_store):
    _fake_live_worker(["default"], ["tests.echo", "tests.send_emial"])
    _due_a_minute_ago(live_store, "tests.send_emial")
    assert check("default", max_age_ms=3_600_000).problems == ()


def test_the_check_seeks_the_claim_index_and_never_scans_the_table(store):
    from cairnq_django.observability.unhandled import unhandled_names
    from tests.test_query_plans import explain_each, full_scans, recorded, uses_index

    store.submit_many([store.prepare(f"plan.{i % 5}", {}, queue="q1") for i in range(3000)])
    with connection.cursor() as cursor:
        # As in production: most rows finished, the queued ones few.
        cursor.execute(
            "UPDATE cairnq_tasks SET status = 'succeeded', completed_at_ms = created_at_ms"
            " WHERE id IN (SELECT id FROM cairnq_tasks ORDER BY id LIMIT 2900)"
        )
        cursor.execute("ANALYZE cairnq_tasks" if connection.vendor == "postgresql" else "ANALYZE")
    with recorded() as statements:
        found = unhandled_names(
            "default", ["q1"], now_ms=database_now_ms("default") + 1, min_wait_ms=0,
            registered={"q1": {"plan.0", "plan.1"}},
        )
    assert sorted(item.name for item in found) == ["plan.2", "plan.3", "plan.4"]
    seeks = explain_each(statements, "ORDER BY queue ASC")
    assert len(seeks) == 6  # five names, then the look that finds none
    for text in seeks:
        assert uses_index(text, "cairnq_tasks_claim_name_idx"), text
    for text in explain_each(statements, "cairnq_tasks"):
        assert not full_scans(text), text


def test_a_warning_lists_a_few_handled_names_not_all():
    from cairnq_django.observability.unhandled import UnhandledName, describe

    line = describe(UnhandledName("default", "send_emial", 2, 90_000),
                    handled_here=[f"app.task{i:02}" for i in range(20)])
    assert "(live workers serving that queue run: app.task00, app.task01," in line
    assert "app.task07 and 12 more)" in line and "app.task08" not in line
