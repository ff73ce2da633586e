"""Workers behind a broken network: blackhole, reset and latency on a real link (issue 31).

Two `cairnq_worker` processes run in a network namespace of the test's own
(netfault.py) and reach a throwaway PostgreSQL cluster on the host end of a
veth pair; a third runs on the host, over loopback, as the healthy peer. Tasks
of 20-200 ms, due at a steady rate over the whole run, append start and end
lines to a journal (tests.net_journal). Faults are set on the namespace's link;
after each the test measures, and prints:

- dropped: seconds from the fault until none of the namespace's connections
  that were open when it began is still established;
- claiming again: seconds from the healing until a namespace worker starts a task.

and, from the journal and the table at the end: no task lost (all
succeeded), none run again after a run of it had finished, none finished twice.

The CI run (default lease, 30 s): a 10 s reset, a 20 s blackhole, 5 s of
200 ms latency. CAIRNQ_NETWORK_LONG=1 adds a 2 min blackhole and a path that
never heals (the namespace's workers are killed at the end), where the lease
is shorter than the outage: re-runs are then allowed, but only of tasks the
healthy worker recovered after their lease expired. Nothing is timed in an
assertion except the issue's own targets, which hold with a wide margin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.reliability import netfault
from tests.reliability.netfault import Namespace, VethCluster
from tests.reliability.pgcluster import unavailable as cluster_unavailable
from tests.workerutil import ROOT

pytestmark = pytest.mark.slow

DBNAME = "cairnq_netfaults"
LONG = os.environ.get("CAIRNQ_NETWORK_LONG") == "1"
RATE = 12  # tasks due per second


@pytest.fixture
def network():
    if os.environ.get("CAIRNQ_TEST_DATABASE") != "postgres":
        pytest.skip("network faults: runs only with CAIRNQ_TEST_DATABASE=postgres")
    reason = netfault.unavailable() or cluster_unavailable()
    if reason:
        pytest.skip(f"network faults: {reason}")
    namespace = Namespace()
    cluster = None
    try:
        namespace.create()
        VethCluster.listen_also = namespace.host_ip
        cluster = VethCluster.create()
        cluster.create_database(DBNAME)
        migrate = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            env=cluster.child_env(DBNAME), cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
        assert migrate.returncode == 0, f"migrate failed:\n{migrate.stdout}\n{migrate.stderr}"
        yield namespace, cluster
    finally:
        namespace.destroy()
        if cluster is not None:
            cluster.destroy()


class Fleet:
    """The worker processes, their logs, and the journal of handler runs."""

    def __init__(self, namespace: Namespace, cluster: VethCluster, tmp: Path) -> None:
        self.namespace, self.cluster, self.tmp = namespace, cluster, tmp
        self.journal = tmp / "journal.txt"
        self.journal.touch()
        self.procs: list[tuple[str, subprocess.Popen, object]] = []

    def start(self, where: str, concurrency: int) -> subprocess.Popen:
        env = self.cluster.child_env(DBNAME)
        prefix: list[str] = []
        if where == "ns":
            env["PGHOST"] = self.namespace.host_ip
            prefix = self.namespace.exec_prefix()
        log = open(self.tmp / f"worker-{where}-{len(self.procs)}.log", "w")
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "django", "cairnq_worker",
             "--concurrency", str(concurrency), "-v", "2"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
        self.procs.append((where, proc, log))
        return proc

    def pids(self, where: str) -> set[str]:
        return {str(p.pid) for w, p, _ in self.procs if w == where and p.poll() is None}

    def enqueue(self, count: int) -> None:
        """`count` journal tasks, due RATE a second from now on; one in ten runs 2-4 s."""
        script = (
            "import django, json, random, sys; django.setup();"
            "from cairnq_django import enqueue_many;"
            "path, count, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]);"
            "rnd = random.Random(31);"
            "enqueue_many([{'name': 'tests.net_journal', 'payload': {'path': path,"
            " 'ms': rnd.randint(2000, 4000) if i % 10 == 0 else rnd.randint(20, 200)},"
            " 'delay': int(i * 1000 / rate)} for i in range(count)])"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, str(self.journal), str(count), str(RATE)],
            env=self.cluster.child_env(DBNAME), cwd=ROOT, capture_output=True, text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr

    def lines(self) -> list[tuple[str, str, str, float]]:
        return [line[:4] for line in self._lines()]

    def _lines(self) -> list[tuple[str, str, str, float, int]]:
        out = []
        for line in self.journal.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                out.append((parts[0], parts[1], parts[2], float(parts[3]), int(parts[4])))
        return out

    def wait_for_a_long_task_in_the_namespace(self, timeout: float = 60) -> None:
        """Until a namespace worker is running a 2-4 s task: a fault then catches a lease held."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            lines = self._lines()
            ended = {task_id for kind, task_id, *_ in lines if kind == "end"}
            pids = self.pids("ns")
            if any(kind == "start" and pid in pids and ms >= 2000 and task_id not in ended
                   for kind, task_id, pid, _, ms in lines):
                return
            time.sleep(0.1)
        raise AssertionError(f"No long task started in the namespace within {timeout}s")

    def first_start_after(self, pids: set[str], since: float, timeout: float) -> float | None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            starts = [t for kind, _, pid, t in self.lines()
                      if kind == "start" and pid in pids and t > since]
            if starts:
                return min(starts) - since
            time.sleep(0.2)
        return None

    def unfinished(self) -> int:
        with self.cluster.connect(DBNAME) as conn:
            return conn.execute(
                "SELECT count(*) FROM cairnq_tasks WHERE status <> 'succeeded'"
            ).fetchone()[0]

    def stop(self) -> None:
        for _, proc, log in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {Path(log.name).name}\n" + Path(log.name).read_text(errors="replace")[-3000:]
            for _, _, log in self.procs
        )


def _watch_drop(namespace: Namespace, port: int, before: set[str], started: float, out: dict):
    """Record when none of `before` (sockets open at the fault) is established any more."""
    while time.time() - started < 600 and not out.get("stop"):
        if not (namespace.established(port) & before):
            out["dropped"] = time.time() - started
            return
        time.sleep(0.25)


def _fault(fleet: Fleet, kind: str, seconds: float, results: list, *, heal: bool = True) -> None:
    namespace, port = fleet.namespace, fleet.cluster.port
    fleet.wait_for_a_long_task_in_the_namespace()
    before = namespace.established(port)
    started = time.time()
    watch: dict = {}
    watcher = threading.Thread(target=_watch_drop, args=(namespace, port, before, started, watch))
    watcher.start()
    if kind == "blackhole":
        namespace.blackhole()
    elif kind == "reset":
        namespace.reset()
    else:
        namespace.latency(200)
    time.sleep(seconds)
    healed = time.time()
    if heal:
        namespace.heal()
        again = fleet.first_start_after(fleet.pids("ns"), healed, 60)
    else:
        again = None
    watch["stop"] = kind == "latency"
    watcher.join(60)
    watch["stop"] = True
    results.append({
        "fault": kind, "seconds": seconds, "connections_at_fault": len(before),
        "dropped_s": None if watch.get("dropped") is None else round(watch["dropped"], 2),
        "claiming_again_s": None if again is None else round(again, 2), "healed": heal,
        "at": started, "healed_at": healed,
    })


def _verdict(fleet: Fleet) -> dict:
    runs: dict[str, list[tuple[str, str, float]]] = defaultdict(list)
    for kind, task_id, pid, t in fleet.lines():
        runs[task_id].append((kind, pid, t))
    rerun_after_finish, finished_twice, recovered = [], [], 0
    rerun_after_s: list[float] = []  # from a task's first start to its next, by lease recovery
    for task_id, events in runs.items():
        events.sort(key=lambda e: e[2])
        ends = [e for e in events if e[0] == "end"]
        if len(ends) > 1:
            finished_twice.append(task_id)
        if ends and any(e[0] == "start" and e[2] > ends[0][2] for e in events):
            rerun_after_finish.append(task_id)
        starts = [e[2] for e in events if e[0] == "start"]
        if len(starts) > 1:
            recovered += 1
            rerun_after_s.append(round(starts[1] - starts[0], 1))
    with fleet.cluster.connect(DBNAME) as conn:
        # Attempts past the first: leases that expired and were recovered
        # (a claim whose answer the blackhole swallowed never shows in the journal).
        recovered_leases = conn.execute(
            "SELECT count(*) FROM cairnq_tasks WHERE attempt > 1"
        ).fetchone()[0]
    return {
        "recovered_leases": recovered_leases,
        "tasks_run": len(runs), "unfinished": fleet.unfinished(),
        "finished_then_rerun": len(rerun_after_finish), "finished_twice": len(finished_twice),
        "run_more_than_once": recovered,
        "rerun_after_s": sorted(rerun_after_s),
    }


def _scenario(network, tmp_path, phases, *, gap: float = 4.0):
    namespace, cluster = network
    fleet = Fleet(namespace, cluster, tmp_path)
    span = 6 + sum(seconds + gap + 8 for _, seconds, _ in phases)
    try:
        fleet.enqueue(int(span * RATE))
        for _ in range(2):
            fleet.start("ns", 4)
        fleet.start("host", 2)
        first = fleet.first_start_after(fleet.pids("ns"), 0, 60)
        assert first is not None, fleet.logs()
        time.sleep(gap)
        results: list = []
        for kind, seconds, heal in phases:
            _fault(fleet, kind, seconds, results, heal=heal)
            time.sleep(gap)
        if not all(heal for *_, heal in phases):
            # The never-healing path: its workers are given up on, as an operator would.
            # and replaced by workers elsewhere, which drain the backlog.
            for where, proc, _ in list(fleet.procs):
                if where == "ns":
                    proc.kill()
                    fleet.start("host", 4)
        deadline = time.time() + 300
        while fleet.unfinished() and time.time() < deadline:
            time.sleep(1)
        verdict = _verdict(fleet)
        print("\nnetwork faults:", json.dumps({"phases": results, "verdict": verdict}, indent=1))
        return results, verdict, fleet
    finally:
        fleet.stop()


def test_reset_blackhole_and_latency_lose_nothing_and_rerun_no_finished_task(network, tmp_path):
    phases = [("reset", 10, True), ("blackhole", 20, True)]
    if netfault.latency_unavailable() is None:
        phases.append(("latency", 5, True))
    else:
        print(f"latency phase skipped: {netfault.latency_unavailable()}")
    results, verdict, fleet = _scenario(network, tmp_path, phases)
    assert verdict["unfinished"] == 0, (verdict, fleet.logs())
    assert verdict["finished_then_rerun"] == 0, verdict
    assert verdict["finished_twice"] == 0, verdict
    # A 2-4 s task was running in the namespace at each fault: its completion
    # waited out the outage, within its lease, and was not run again (above).
    # (recovered_leases is printed, not asserted: a claim answered at the very
    # moment of a fault leases tasks its worker never learns of, rightly recovered.)
    for phase in results:
        if phase["fault"] == "latency":
            continue  # nothing breaks: a slower link, not a dead one
        assert phase["claiming_again_s"] is not None, (phase, fleet.logs())
        assert phase["claiming_again_s"] < 5, phase
        if phase["fault"] == "blackhole":
            assert phase["dropped_s"] is not None and phase["dropped_s"] < 15, phase


@pytest.mark.skipif(not LONG, reason="the long outages: set CAIRNQ_NETWORK_LONG=1")
def test_long_and_never_healing_blackholes(network, tmp_path):
    phases = [("blackhole", 120, True), ("blackhole", 75, False)]
    results, verdict, fleet = _scenario(network, tmp_path, phases)
    assert verdict["unfinished"] == 0, (verdict, fleet.logs())
    assert verdict["finished_twice"] <= verdict["run_more_than_once"]
    # The never-healing path held a lease at the fault: a healthy worker recovered it.
    assert verdict["recovered_leases"] >= 1, verdict
    for phase in results:
        assert phase["dropped_s"] is not None and phase["dropped_s"] < 15, phase
        if phase["healed"]:
            assert phase["claiming_again_s"] is not None and phase["claiming_again_s"] < 5, phase
