"""A PostgreSQL restart under load: no lost enqueue, workers and waiters recover (issue 9).

On a throwaway cluster of its own (tests/reliability/pgcluster.py; the shared
server is never restarted), two real `cairnq_worker` processes drain what a
producer process enqueues in a loop, while a waiter process waits on a task
that is running, and awaits a key that points at nothing yet. Midway the
cluster is restarted with `pg_ctl restart -m fast`. Afterwards:

- every enqueue that returned an id is a task that ends succeeded;
- every enqueue that raised left no row (each attempt has its own correlation_id);
- both workers are still alive and both run new tasks;
- the waiter got every result: wait(), await_task_by_key() and call().

Nothing is timed: every loop is bounded in count and in time, and a deadline
only bounds how long a condition may take to come true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.pgcluster import ThrowawayCluster, unavailable
from tests.workerutil import ROOT, WorkerProcess

pytestmark = pytest.mark.slow

DBNAME = "cairnq_restart"
RUNS_TABLE = "worker_test_runs"  # tests/testapp/tasks.py's record_run writes here
KEY = "pg-restart-waiter"
WORKER_ARGS = ("--concurrency", "2", "--lease", "3000", "--poll", "200", "-v", "2")
PRODUCER_MAX_ATTEMPTS = 3000
PRODUCER_MAX_SECONDS = 240


def _deadline_loop(predicate, *, timeout: float, what: str, interval: float = 0.1, info=None):
    """Poll `predicate` (bounded by `timeout`); return its truthy value or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = info() if info else ""
            raise AssertionError(f"Not within {timeout}s: {what}.\n{detail}")
        time.sleep(interval)


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass  # a line being written right now
    return records


@pytest.fixture
def cluster():
    if os.environ.get("CAIRNQ_TEST_DATABASE") != "postgres":
        pytest.skip("PostgreSQL restart test: runs only with CAIRNQ_TEST_DATABASE=postgres")
    reason = unavailable()
    if reason:
        pytest.skip(f"PostgreSQL restart test: {reason}")
    made = ThrowawayCluster.create()
    try:
        made.create_database(DBNAME)
        env = made.child_env(DBNAME)
        migrate = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert migrate.returncode == 0, f"migrate failed:\n{migrate.stdout}\n{migrate.stderr}"
        with made.connect(DBNAME) as conn:
            conn.execute(
                f"CREATE TABLE {RUNS_TABLE} (id serial PRIMARY KEY, task_id text NOT NULL,"
                " worker_id text NOT NULL, attempt integer NOT NULL, note text NOT NULL)"
            )
        yield made
    finally:
        made.destroy()


class Child:
    """A client process of pgcluster_clients, its output in a file."""

    def __init__(self, env: dict, tmp: Path, role: str, *args: str) -> None:
        self.out = tmp / f"{role}.jsonl"
        self.log_path = tmp / f"{role}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.pgcluster_clients", role,
             str(self.out), *args],
            env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def records(self) -> list[dict]:
        return _lines(self.out)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def finish(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.out.stem} did not exit within {timeout}s:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def test_restart_loses_no_enqueue_and_every_client_recovers(cluster, tmp_path):
    env = cluster.child_env(DBNAME)
    query_conn = None

    def query(sql, params=()):
        nonlocal query_conn
        # The test's own reads reconnect too: the restart ends this session.
        for _ in range(50):
            try:
                if query_conn is None or query_conn.closed:
                    query_conn = cluster.connect(DBNAME)
                return query_conn.execute(sql, params).fetchall()
            except Exception:
                if query_conn is not None:
                    query_conn.close()
                query_conn = None
                time.sleep(0.2)
        raise AssertionError(f"The throwaway cluster stopped answering:\n{cluster.server_log()}")

    workers = [WorkerProcess(env, *WORKER_ARGS) for _ in range(2)]
    stop_file = tmp_path / "producer.stop"
    children: list[Child] = []

    def everything():
        parts = [f"--- worker {w.pid} ---\n{w.output()[-4000:]}" for w in workers]
        parts += [f"--- {c.out.stem} ---\n{c.output()[-4000:]}" for c in children]
        return "\n".join(parts + [f"--- server ---\n{cluster.server_log()[-4000:]}"])

    try:
        producer = Child(env, tmp_path, "producer", str(stop_file),
                         str(PRODUCER_MAX_ATTEMPTS), str(PRODUCER_MAX_SECONDS))
        children.append(producer)

        # Workers draining what the producer writes.
        _deadline_loop(
            lambda: query("SELECT count(*) FROM cairnq_tasks WHERE status = 'succeeded'")[0][0]
            >= 20,
            timeout=120, what="20 produced tasks succeeded before the restart", info=everything,
        )

        waiter = Child(env, tmp_path, "waiter", KEY)
        children.append(waiter)
        enqueued = _deadline_loop(
            lambda: [r for r in waiter.records() if r.get("step") == "enqueued"],
            timeout=60, what="the waiter enqueued its task", info=everything,
        )
        waited_id = enqueued[0]["id"]
        # Restart while the waited task runs: the wait spans the restart.
        _deadline_loop(
            lambda: query("SELECT status FROM cairnq_tasks WHERE id = %s", [waited_id])
            == [("running",)],
            timeout=60, what="a worker started the waiter's task", info=everything,
        )

        before = len(producer.records())
        restart_s = cluster.restart("fast")
        restarted_at = time.time()

        # Let the producer go on well past the restart, then stop it.
        _deadline_loop(
            lambda: sum("id" in r and r["t"] > restarted_at for r in producer.records()) >= 50,
            timeout=120, what="50 enqueues returned after the restart", info=everything,
        )
        stop_file.write_text("stop")
        assert producer.finish(60) == 0, everything()

        assert waiter.finish(300) == 0, everything()
        steps = {r["step"]: r for r in waiter.records()}
        assert "error" not in steps, everything()
        assert steps["waited"]["status"] == "succeeded"
        assert steps["waited"]["result"] == {"slept": 6}
        assert (steps["awaited_key"].get("result") or {}).get("echo") == {"by": "key"}, steps
        assert steps["called"]["result"]["echo"] == {"by": "call"}
        # The wait really lost its connection and recovered (one warning).
        assert waiter.output().count("lost its connection") >= 1, waiter.output()

        # Every enqueue that returned an id ends succeeded.
        attempts = producer.records()
        returned = [r for r in attempts if "id" in r]
        raised = [r for r in attempts if "error" in r]
        ids = [r["id"] for r in returned]

        def unfinished():
            rows = query(
                "SELECT id, status FROM cairnq_tasks WHERE id = ANY(%s)"
                " AND status NOT IN ('succeeded', 'failed', 'canceled')", [ids]
            )
            return not rows

        _deadline_loop(unfinished, timeout=180, what="every produced task finished",
                       interval=0.5, info=everything)
        rows = dict(query(
            "SELECT id, status FROM cairnq_tasks WHERE id = ANY(%s)", [ids]
        ))
        missing = [i for i in ids if i not in rows]
        not_ok = {i: s for i, s in rows.items() if s != "succeeded"}
        assert not missing, f"{len(missing)} returned ids have no row: {missing[:5]}"
        assert not not_ok, f"{len(not_ok)} produced tasks did not succeed: {list(not_ok.items())[:5]}"
        marker_of = dict(query(
            "SELECT id, correlation_id FROM cairnq_tasks WHERE id = ANY(%s)", [ids]
        ))
        assert all(marker_of[r["id"]] == r["marker"] for r in returned)

        # Every enqueue that raised left no row.
        raised_markers = [r["marker"] for r in raised]
        leftovers = query(
            "SELECT correlation_id, id FROM cairnq_tasks WHERE correlation_id = ANY(%s)",
            [raised_markers],
        )
        assert leftovers == [], f"enqueues that raised left rows: {leftovers}"

        # Both workers are alive and both still take new tasks.
        assert all(w.proc.poll() is None for w in workers), everything()
        probe = Child(env, tmp_path, "enqueue", "tests.sleep",
                      json.dumps({"seconds": 0.5, "record": True}), "8")
        children.append(probe)
        assert probe.finish(60) == 0, everything()
        probe_ids = [r["id"] for r in probe.records()]
        _deadline_loop(
            lambda: query(
                "SELECT count(*) FROM cairnq_tasks WHERE id = ANY(%s) AND status = 'succeeded'",
                [probe_ids],
            )[0][0] == len(probe_ids),
            timeout=120, what="the 8 probe tasks succeeded", info=everything,
        )
        probe_workers = query(
            f"SELECT DISTINCT worker_id FROM {RUNS_TABLE} WHERE task_id = ANY(%s)", [probe_ids]
        )
        assert len(probe_workers) == 2, f"probe tasks ran on {probe_workers}\n{everything()}"

        # The figures, for the report (pytest -s or -rA shows them).
        reruns = query(
            f"SELECT count(*) FROM (SELECT task_id FROM {RUNS_TABLE} WHERE task_id = ANY(%s)"
            " GROUP BY task_id HAVING count(*) > 1) AS r", [ids]
        )[0][0]
        later_attempts = query(
            "SELECT count(*) FROM cairnq_tasks WHERE id = ANY(%s) AND attempt > 1", [ids]
        )[0][0]
        kinds: dict[str, int] = {}
        for r in raised:
            if "connection failed" in r["error"]:
                kind = "connect failed"
            elif "terminating connection" in r["error"]:
                kind = "session terminated"
            else:
                kind = r["error"][:60]
            kinds[kind] = kinds.get(kind, 0) + 1
        print(
            f"\npg restart figures: {len(attempts)} enqueue attempts, {len(returned)} returned "
            f"an id ({before} before the restart), {len(raised)} raised {kinds}; "
            f"pg_ctl restart -m fast took {restart_s:.2f}s; "
            f"{reruns} produced tasks ran more than once, {later_attempts} ended on attempt > 1; "
            f"the waited task ended on attempt {steps['waited']['attempt']}."
        )

        for worker in workers:
            worker.signal(15)
        for worker in workers:
            assert worker.wait(60) == 0, worker.output()
    finally:
        for child in children:
            child.kill()
        for worker in workers:
            worker.stop()
        if query_conn is not None:
            query_conn.close()


def test_missing_binaries_are_a_clear_skip_reason(monkeypatch):
    """Where Debian's PostgreSQL binaries are absent, the restart test skips saying so."""
    from tests.reliability import pgcluster

    monkeypatch.setattr(pgcluster.glob, "glob", lambda pattern: [])
    assert pgcluster.find_bindir() is None
    assert unavailable().startswith("pg binaries missing")
