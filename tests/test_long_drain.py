"""A long drain: one worker process, many no-op tasks, nothing that grows with history.

One real `cairnq_worker --burst --concurrency 8` drains CAIRNQ_LONG_DRAIN_TASKS
tasks (default 20,000, small enough for CI; issue 31 measures 200,000). The
test samples the worker while it runs and prints the drain rate of the first
and the last window (20,000 tasks, or a fifth of a smaller run), the worker's
RSS, its open descriptors and the server sessions of the test database
(PostgreSQL). Rates are printed, never asserted (speed belongs in bench/);
what is asserted holds on any machine: every task ran exactly once (succeeded
at attempt 1), descriptors, sessions and memory stay flat, and on PostgreSQL
the worker VACUUMed the queue table on its way (worker/upkeep.py).

Run the real figure with `pytest -s` and CAIRNQ_LONG_DRAIN_TASKS=200000.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from django.db import connections

from cairnq_django import enqueue_many
from cairnq_django.worker.upkeep import MIN_CLAIMS
from tests.workerutil import WorkerProcess

pytestmark = pytest.mark.slow

TASKS = int(os.environ.get("CAIRNQ_LONG_DRAIN_TASKS", "20000"))
WINDOW = min(20_000, TASKS // 5)
ENQUEUE_CHUNK = 20_000
SAMPLE_S = 0.5
# Generous bounds, never expected to be reached on a healthy run.
DRAIN_DEADLINE_S = 60 + TASKS / 50
# Descriptors and sessions may differ by a connection being reopened, not grow.
DESCRIPTOR_SLACK = 4
SESSION_SLACK = 2
RSS_GROWTH_LIMIT_KB = 64 * 1024


def _scalar(sql: str, params: list | None = None):
    with connections["default"].cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def _succeeded() -> int:
    return int(_scalar("SELECT count(*) FROM cairnq_tasks WHERE status = 'succeeded'"))


def _vacuums() -> int | None:
    """VACUUMs of the queue table so far, the worker's and autovacuum's (PostgreSQL only)."""
    if connections["default"].vendor != "postgresql":
        return None
    return int(_scalar(
        "SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables"
        " WHERE relid = 'cairnq_tasks'::regclass"
    ))


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _sessions() -> int | None:
    """Server sessions on the test database besides this test's own (PostgreSQL only)."""
    if connections["default"].vendor != "postgresql":
        return None
    return int(_scalar(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        # Not an autovacuum worker that happens to be on this database.
        " AND backend_type = 'client backend'"
    ))


class Sample:
    """The worker's footprint at one moment, with how many tasks were done by then."""

    def __init__(self, pid: int) -> None:
        self.rss_kb = _rss_kb(pid)
        self.descriptors = _descriptors(pid)
        self.sessions = _sessions()
        self.done = _succeeded()


def _window_rates() -> tuple[float, float]:
    """Tasks per second over the first and the last WINDOW completions, from their own stamps."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT completed_at_ms FROM cairnq_tasks WHERE status = 'succeeded'"
            " ORDER BY completed_at_ms"
        )
        stamps = [row[0] for row in cursor.fetchall()]

    def rate(window: list[int]) -> float:
        return (len(window) - 1) / max((window[-1] - window[0]) / 1000, 0.001)

    return rate(stamps[:WINDOW]), rate(stamps[-WINDOW:])


def _enqueue(count: int) -> None:
    for start in range(0, count, ENQUEUE_CHUNK):
        size = min(ENQUEUE_CHUNK, count - start)
        enqueue_many([("tests.echo", {"n": start + i}) for i in range(size)])


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_long_drain_runs_every_task_once_and_stays_flat(live_store, child_env):
    _enqueue(TASKS)
    vacuums_before = _vacuums()
    worker = WorkerProcess(child_env, "--burst", "--concurrency", "8", "-v", "1")
    samples: list[Sample] = []
    try:
        deadline = time.monotonic() + DRAIN_DEADLINE_S
        while worker.proc.poll() is None:
            assert time.monotonic() < deadline, (
                f"{TASKS} tasks not drained in {DRAIN_DEADLINE_S:.0f}s:\n{worker.output()[-3000:]}"
            )
            try:
                samples.append(Sample(worker.pid))
            except (FileNotFoundError, ProcessLookupError, AssertionError):
                break  # the worker exited between poll() and the read
            time.sleep(SAMPLE_S)
        assert worker.wait() == 0, worker.output()[-3000:]
    finally:
        worker.stop()

    final = _succeeded()
    vacuums = None if vacuums_before is None else _vacuums() - vacuums_before
    assert samples, worker.output()[-3000:]
    first, last = _window_rates()
    # The flat checks compare a sample past start-up (a quarter done) with the last one
    # taken while tasks were still left (not the worker's shutdown).
    draining = [s for s in samples if s.done < TASKS] or samples
    early = next((s for s in draining if s.done >= TASKS // 4), draining[0])
    late = draining[-1]
    print(
        f"\nlong drain ({connections['default'].vendor}, {TASKS} tasks): "
        f"first {WINDOW} at {first:.0f}/s, last {WINDOW} at {last:.0f}/s ({last / first:.2f}x); "
        f"RSS {early.rss_kb / 1024:.1f} -> {late.rss_kb / 1024:.1f} MB; "
        f"descriptors {early.descriptors} -> {late.descriptors}; "
        f"server sessions {early.sessions} -> {late.sessions}; VACUUMs of the table {vacuums}"
    )

    # Every task ran exactly once: succeeded at its first attempt, nothing left over.
    assert final == TASKS
    assert _scalar("SELECT count(*) FROM cairnq_tasks") == TASKS
    assert _scalar("SELECT count(*) FROM cairnq_tasks WHERE attempt <> 1") == 0
    assert late.descriptors <= early.descriptors + DESCRIPTOR_SLACK
    if early.sessions is not None:
        assert late.sessions <= early.sessions + SESSION_SLACK
    assert late.rss_kb - early.rss_kb < RSS_GROWTH_LIMIT_KB
    # PostgreSQL: the worker VACUUMed the table as it went (worker/upkeep.py).
    if vacuums is not None and TASKS >= 2 * MIN_CLAIMS:
        assert vacuums >= 1
