"""Run one benchmark cell (system x backend x workload) and print its result as JSON.

`python -m bench.cell WORKLOAD [--n N] [--setting "..."] ...` with BENCH_SYSTEM,
BENCH_BACKEND and BENCH_DB in the environment; the database is fresh and
already migrated (the harness copies it from a per-system template).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

from .adapters import BACKEND, DB, OFF_DATABASE, SYSTEM, Probe, get_adapter, setting_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG_DIR = os.environ.get("BENCH_LOG_DIR", "/tmp")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def mono() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class WorkerProcess:
    """The system's own worker, started as its users would start it."""

    def __init__(self, cmd: list[str], stamp: str | None = None, setting: str | None = None) -> None:
        # The harness's PYTHONPATH puts a --baseline checkout ahead of this tree.
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench.project.settings")
        env.setdefault("PYTHONPATH", ROOT)
        env.update(setting_env(setting))
        if stamp:
            env["BENCH_STAMP"] = stamp
        self.log = open(os.path.join(LOG_DIR, f"worker-{SYSTEM}-{BACKEND}.log"), "ab")
        # The harness's working directory: a --baseline run starts in its checkout.
        # A session of its own, so stop() reaches pool processes (Celery's
        # prefork children, django-q2's cluster) as well as the main one.
        self.proc = subprocess.Popen(
            cmd, cwd=os.getcwd(), env=env, stdout=self.log, stderr=self.log, start_new_session=True
        )

    def cpu_seconds(self) -> float:
        """User+system CPU of the worker and every process under it (Celery's
        and django-q2's pool processes), live or already reaped."""
        stats: dict[int, list[str]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        stats[int(entry)] = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue  # exited while we looked
        tree, frontier = set(), [self.proc.pid]
        while frontier:
            pid = frontier.pop()
            tree.add(pid)
            frontier.extend(p for p, fields in stats.items() if int(fields[1]) == pid and p not in tree)
        ticks = sum(sum(int(x) for x in stats[p][11:15]) for p in tree if p in stats)
        return ticks / CLK_TCK

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"The worker exited early with {self.proc.returncode}; see {self.log.name}.")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # whatever of the group is left
        self.proc.wait()
        self.log.close()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def w1(adapter, args) -> dict:
    start = mono()
    for _ in range(args.n):
        adapter.enqueue()
    elapsed = mono() - start
    return {"rate": args.n / elapsed, "elapsed": elapsed}


def w1b(adapter, args) -> dict:
    start = mono()
    adapter.enqueue_bulk(args.n)
    elapsed = mono() - start
    return {"rate": args.n / elapsed, "elapsed": elapsed}


class ServerCounters:
    """PostgreSQL's own count of this database's transactions and sessions.

    Read over a connection to the `postgres` database, so reading costs the
    database under test nothing. A backend's transaction counts reach
    pg_stat_database when it goes idle (at most once a second) or exits; the
    drain reads them after the worker stopped.
    """

    def __init__(self) -> None:
        import psycopg

        self.conn = psycopg.connect(dbname="postgres", host="127.0.0.1", user="root", autocommit=True)

    def xacts(self) -> int:
        row = self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [DB]
        ).fetchone()
        return int(row[0])

    def sessions(self) -> int:
        # Client sessions only: an autovacuum worker on the table is not the system's.
        row = self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
            [DB],
        ).fetchone()
        return int(row[0])


def _drain(adapter, args, target: int, probe: Probe) -> dict:
    """Run the worker until `target` no-op tasks finished; rate from completion times.

    On PostgreSQL (for the systems whose queue is in it) also the
    transactions per task (every transaction on the database while the
    worker ran, its start-up and the progress reads included) and the most
    sessions the worker held at once. On both, the worker's CPU (user+sys,
    from spawn to the last task) per task, and the time from spawn to the
    first task done: start-up plus the first claim and settle, which a user
    waits through on every deploy.
    """
    counters = ServerCounters() if BACKEND == "postgres" and SYSTEM not in OFF_DATABASE else None
    if counters is not None:
        own_sessions = counters.sessions()  # this process's: the probe's, the enqueue's
        time.sleep(1.1)  # this process's enqueue counts reach the statistics
        xacts_before = counters.xacts()
        peak_sessions = 0
    # Epoch time, as the probe's completion times are.
    spawned = time.time()
    worker = WorkerProcess(adapter.worker_cmd(args.setting), setting=args.setting)
    deadline = mono() + args.timeout
    polls = 0
    try:
        while True:
            count, first, last = probe.done()
            polls += 1
            if count >= target:
                break
            worker.check()
            if mono() > deadline:
                raise RuntimeError(f"Drain timed out with {count}/{target} done.")
            if counters is not None:
                peak_sessions = max(peak_sessions, counters.sessions() - own_sessions)
            time.sleep(0.25)
        cpu = worker.cpu_seconds()
    finally:
        worker.stop()
    result = {"rate": (count - 1) / (last - first), "done": count, "window": last - first,
              "cpu_us_per_task": cpu / target * 1e6, "first_done_s": first - spawned}
    if counters is not None:
        time.sleep(1.1)  # the probe's own counts, too, before they are subtracted
        result["xact_per_task"] = (counters.xacts() - xacts_before - polls) / target
        result["sessions_per_worker"] = float(peak_sessions)
    return result


def w2(adapter, args) -> dict:
    adapter.enqueue_bulk(args.n)
    return _drain(adapter, args, args.n, Probe())


class Stamps:
    """Tail the file the handlers append '<seq> <monotonic>' lines to."""

    def __init__(self, path: str) -> None:
        self.path = path
        open(path, "w").close()
        self.f = open(path)
        self.seen: dict[int, float] = {}
        self.buf = ""

    def wait_for(self, seq: int, timeout: float, worker: WorkerProcess) -> float:
        deadline = mono() + timeout
        while seq not in self.seen:
            chunk = self.f.read()
            if chunk:
                self.buf += chunk
                *lines, self.buf = self.buf.split("\n")
                for line in lines:
                    s, t = line.split()
                    self.seen[int(s)] = float(t)
                continue
            if mono() > deadline:
                worker.check()
                raise RuntimeError(f"Task {seq} was not picked up within {timeout} s.")
            time.sleep(0.0005)
        return self.seen[seq]


def w3(adapter, args) -> dict:
    stamp_path = os.path.join(LOG_DIR, f"stamps-{SYSTEM}-{BACKEND}-{os.getpid()}.txt")
    stamps = Stamps(stamp_path)
    worker = WorkerProcess(adapter.worker_cmd(args.setting), stamp=stamp_path, setting=args.setting)
    try:
        adapter.enqueue(seq=-1)  # warm-up: the worker is up once this one ran
        stamps.wait_for(-1, 60, worker)
        time.sleep(1.0)
        latencies = []
        for seq in range(args.n):
            # A random idle gap so each enqueue lands at a random point of any poll cycle.
            time.sleep(random.uniform(0.1, 0.3))
            adapter.enqueue(seq=seq)
            returned = mono()
            latencies.append((stamps.wait_for(seq, 30, worker) - returned) * 1000)
        time.sleep(1.0)
        cpu_before, t0 = worker.cpu_seconds(), mono()
        time.sleep(args.idle)
        idle_cpu = (worker.cpu_seconds() - cpu_before) / (mono() - t0) * 100
    finally:
        worker.stop()
        os.unlink(stamp_path)
    return {
        "p50": statistics.median(latencies),
        "p95": pct(latencies, 0.95),
        "idle_cpu_pct": idle_cpu,
        "samples": len(latencies),
    }


def w6(adapter, args) -> dict:
    """Lateness of delayed tasks: handler start minus the time it was due, idle worker.

    Each task is enqueued at a random moment with a random delay of 0.5-5 s; its
    due time is read just before the enqueue call, so the call's own duration
    (about a millisecond) counts as lateness.
    """
    stamp_path = os.path.join(LOG_DIR, f"stamps-w6-{SYSTEM}-{BACKEND}-{os.getpid()}.txt")
    stamps = Stamps(stamp_path)
    worker = WorkerProcess(adapter.worker_cmd(args.setting), stamp=stamp_path, setting=args.setting)
    try:
        adapter.enqueue(seq=-1)  # warm-up: the worker is up once this one ran
        stamps.wait_for(-1, 60, worker)
        time.sleep(1.0)
        due = {}
        for seq in range(args.n):
            time.sleep(random.uniform(0.05, 0.3))
            delay = random.uniform(0.5, 5.0)
            due[seq] = mono() + delay
            adapter.enqueue_delayed(seq, delay)
        # django-q2's scheduler looks for due schedules every 30 s or so.
        lateness = [(stamps.wait_for(seq, 120, worker) - due[seq]) * 1000 for seq in range(args.n)]
    finally:
        worker.stop()
        os.unlink(stamp_path)
    return {"p50": statistics.median(lateness), "p95": pct(lateness, 0.95), "samples": len(lateness)}


def w4(adapter, args) -> dict:
    worker = WorkerProcess(adapter.worker_cmd(args.setting), setting=args.setting)
    try:
        adapter.call()  # warm-up
        times = []
        for _ in range(args.n):
            start = mono()
            adapter.call()
            times.append((mono() - start) * 1000)
    finally:
        worker.stop()
    return {"p50": statistics.median(times), "p95": pct(times, 0.95), "samples": len(times)}


def w5(adapter, args) -> dict:
    """Claim latency and drain rate of cairnq_django with `--rows` filler rows in the table."""
    if args.rows and not args.prefilled:
        from . import fill

        fill.fill(args.rows, args.filler)
    adapter.enqueue_bulk(args.n)
    from cairnq_django.store.leases import get_leases

    store = get_leases()
    # Before the claims: their completions must fall inside its window.
    probe = Probe()
    claims = []
    for _ in range(args.claims):
        start = mono()
        tasks = store.claim(queues=["default"], worker_id="bench-claim", lease_ms=60_000, limit=1)
        claims.append((mono() - start) * 1000)
        for task in tasks:
            store.complete(task.id, "bench-claim", None)
    # The claims above completed some tasks; the drain counts the rest.
    already = probe.done()[0]
    drained = _drain(adapter, args, already + args.n - args.claims, probe)
    return {
        "claim_p50": statistics.median(claims),
        "claim_p95": pct(claims, 0.95),
        "rate": drained["rate"],
    }


def fill_only(adapter, args) -> dict:
    """Put W5's filler rows into a template database the repetitions copy."""
    from . import fill

    fill.fill(args.rows, args.filler)
    return {}


WORKLOADS = {"fill": fill_only, "w1": w1, "w1b": w1b, "w2": w2, "w3": w3, "w4": w4, "w5": w5, "w6": w6}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--setting", default=None)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--idle", type=float, default=5)
    parser.add_argument("--rows", type=int, default=0)
    parser.add_argument("--filler", choices=["queued", "succeeded"], default="queued")
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--prefilled", action="store_true", help="W5: fillers already there")
    args = parser.parse_args()
    adapter = get_adapter()
    result = WORKLOADS[args.workload](adapter, args)
    ours = sys.modules.get("cairnq_django")
    if ours is not None:  # which checkout ran: this tree or a --baseline one
        result["code"] = os.path.dirname(os.path.dirname(ours.__file__ or ""))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
