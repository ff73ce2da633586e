"""Fleet cost on PostgreSQL: what N idle workers cost the database, per second and per task.

    python -m bench.herd [--workers 1,8,32] [--concurrency 4] [--tasks 40] [--idle 30]

For each fleet size it starts that many `cairnq_worker` processes on a fresh
database, lets them settle, and then measures, from pg_stat_database
(xact_commit + xact_rollback of that database only, read over a connection to
another database so the reads cost nothing here):

- idle transactions per second per worker, over `--idle` seconds with nothing queued;
- transactions per task beyond the task's own enqueue, while `--tasks` tasks are
  enqueued one at a time with a random 0.1-0.3 s gap (the idle rate over the same
  window is subtracted, so this is what a task adds, herd included);
- pickup p50 and p95 (enqueue returned -> handler started, one host clock);
- sessions per worker (pg_stat_activity of that database), idle and at most while tasks ran.

With `--drain N` it measures instead how fast each fleet drains N queued
no-op tasks (the fleet test's comparison, tests/test_fleet.py, kept out of the
test suite because a timed assertion on 2 busy cores would be flaky):

    python -m bench.herd --drain 20000 --workers 4,16

PostgreSQL flushes a backend's counters when it goes idle at most once a
second (and pending ones after 10 s), so every window ends with a 12 s wait
before the counter is read, and the idle rate is subtracted from it.
Each fleet needs about 3 sessions per worker: with max_connections = 100 and
other clients on the server, 32 workers need workers that hold no more.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = ["-h", "127.0.0.1", "-U", os.environ.get("PGUSER", "root")]
SETTLE_S = 12.0


def mono() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Counters:
    """pg_stat_database and pg_stat_activity for one database, read from the `postgres` database."""

    def __init__(self, db: str) -> None:
        import psycopg

        self.db = db
        self.conn = psycopg.connect(dbname="postgres", host="127.0.0.1", user="root", autocommit=True)

    def xacts(self) -> int:
        row = self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [self.db]
        ).fetchone()
        return int(row[0])

    def sessions(self) -> int:
        row = self.conn.execute(
            # Client sessions only: an autovacuum worker on the table is not the fleet's.
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'",
            [self.db],
        ).fetchone()
        return int(row[0])


def _env(db: str, stamp: str | None = None) -> dict:
    env = dict(
        os.environ, BENCH_SYSTEM="cairnq_django", BENCH_BACKEND="postgres", BENCH_DB=db,
        DJANGO_SETTINGS_MODULE="bench.project.settings",
        PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), ROOT) if p),
    )
    if stamp:
        env["BENCH_STAMP"] = stamp
    return env


def fresh_database(db: str) -> None:
    subprocess.run(["dropdb", *PG, "--if-exists", "--force", db], check=True)
    subprocess.run(["createdb", *PG, db], check=True)
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], cwd=ROOT, env=_env(db),
                   check=True)


def read_stamps(path: str, seen: dict[int, float]) -> None:
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                seen.setdefault(int(parts[0]), float(parts[1]))


def wait_stamp(path: str, seq: int, seen: dict[int, float], timeout: float) -> float:
    deadline = mono() + timeout
    while seq not in seen:
        read_stamps(path, seen)
        if seq in seen:
            break
        if mono() > deadline:
            raise RuntimeError(f"task {seq} was not picked up within {timeout} s")
        time.sleep(0.0005)
    return seen[seq]


def measure(workers: int, concurrency: int, tasks: int, idle_s: float, db: str, logdir: str) -> dict:
    fresh_database(db)
    os.environ.update(_env(db))
    import django

    django.setup()
    from django.db import connections

    import cairnq_django

    counters = Counters(db)
    # What one enqueue costs this process, on a queue nobody serves.
    connections.close_all()
    time.sleep(1.5)
    before = counters.xacts()
    for _ in range(20):
        cairnq_django.enqueue("noop", {}, queue="bench_calibration")
    connections.close_all()  # a backend flushes its counters when it exits
    time.sleep(1.5)
    per_enqueue = (counters.xacts() - before) / 20

    stamp = os.path.join(logdir, f"herd-stamps-{os.getpid()}.txt")
    open(stamp, "w").close()
    log = open(os.path.join(logdir, "herd-workers.log"), "ab")
    cmd = [sys.executable, "-m", "django", "cairnq_worker", "--concurrency", str(concurrency),
           "--queue", "default"]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=_env(db, stamp), stdout=log, stderr=log)
             for _ in range(workers)]
    seen: dict[int, float] = {}
    try:
        # Warm-up: every worker is up once the workers table lists them all.
        deadline = mono() + 120
        from cairnq_django.models import WorkerRecord

        while WorkerRecord.objects.count() < workers:
            if mono() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("workers did not start; see herd-workers.log")
            time.sleep(0.2)
        cairnq_django.enqueue("noop", {"seq": -1})
        wait_stamp(stamp, -1, seen, 60)
        connections.close_all()
        time.sleep(SETTLE_S)

        idle_sessions = counters.sessions()
        t0, x0 = mono(), counters.xacts()
        time.sleep(idle_s)
        t1, x1 = mono(), counters.xacts()
        idle_rate = (x1 - x0) / (t1 - t0)

        latencies = []
        peak_sessions = idle_sessions
        for seq in range(tasks):
            time.sleep(random.uniform(0.1, 0.3))
            cairnq_django.enqueue("noop", {"seq": seq})
            returned = mono()
            latencies.append((wait_stamp(stamp, seq, seen, 30) - returned) * 1000)
            if seq % 5 == 0:
                peak_sessions = max(peak_sessions, counters.sessions())
        connections.close_all()
        time.sleep(SETTLE_S)
        t2, x2 = mono(), counters.xacts()
        extra = (x2 - x1) - idle_rate * (t2 - t1) - per_enqueue * tasks
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        os.unlink(stamp)
        connections.close_all()
    return {
        "workers": workers,
        "concurrency": concurrency,
        "idle_xact_per_s_per_worker": idle_rate / workers,
        "idle_xact_per_s": idle_rate,
        "xact_per_task": extra / tasks,
        "pickup_p50_ms": statistics.median(latencies),
        "pickup_p95_ms": pct(latencies, 0.95),
        "sessions_per_worker_idle": idle_sessions / workers,
        "sessions_per_worker_peak": peak_sessions / workers,
        "enqueue_xacts": per_enqueue,
    }


def drain(workers: int, concurrency: int, tasks: int, db: str, logdir: str) -> dict:
    """Start `workers` processes on `tasks` queued no-op tasks; rate from completion times."""
    fresh_database(db)
    os.environ.update(_env(db))
    import django

    django.setup()
    from django.db import connections

    import cairnq_django

    for start in range(0, tasks, 2_000):
        cairnq_django.enqueue_many([("noop", {})] * min(2_000, tasks - start))
    connections.close_all()
    counters = Counters(db)
    time.sleep(1.5)
    x0 = counters.xacts()
    log = open(os.path.join(logdir, "herd-workers.log"), "ab")
    cmd = [sys.executable, "-m", "django", "cairnq_worker", "--concurrency", str(concurrency)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=_env(db), stdout=log, stderr=log)
             for _ in range(workers)]
    import psycopg

    peek = psycopg.connect(dbname=db, host="127.0.0.1", user="root", autocommit=True)
    sql = ("SELECT count(*), (max(completed_at_ms) - min(completed_at_ms)) / 1000.0 FROM cairnq_tasks"
           " WHERE status = 'succeeded'")
    # Every worker has claimed once when its workers-table row exists (it is
    # written after the first poll): the steady rate counts from there, so
    # the fleets compare claims, not how long 16 processes take to start on
    # 2 cores.
    started_sql = ("SELECT count(*), (extract(epoch from clock_timestamp()) * 1000)::bigint"
                   " FROM cairnq_django_workers")
    all_started_ms = None
    peak = polls = 0
    try:
        deadline = mono() + 900
        while True:
            done, window = peek.execute(sql).fetchone()
            polls += 1
            if all_started_ms is None:
                registered, now_ms = peek.execute(started_sql).fetchone()
                polls += 1
                if registered >= workers:
                    all_started_ms = now_ms
            if done >= tasks:
                break
            if mono() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("the drain did not finish; see herd-workers.log")
            peak = max(peak, counters.sessions() - 1)
            time.sleep(0.5)
    finally:
        peek.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)
        log.close()
    time.sleep(1.5)
    steady = None
    if all_started_ms is not None:
        with psycopg.connect(dbname=db, host="127.0.0.1", user="root", autocommit=True) as late:
            after, last_ms = late.execute(
                "SELECT count(*), max(completed_at_ms) FROM cairnq_tasks"
                " WHERE status = 'succeeded' AND completed_at_ms > %s", [all_started_ms]
            ).fetchone()
        if after and last_ms > all_started_ms:
            steady = after / ((last_ms - all_started_ms) / 1000)
    return {
        "workers": workers,
        "drain_rate": (tasks - 1) / float(window),
        "steady_rate": steady,
        "xact_per_task": (counters.xacts() - x0 - polls) / tasks,
        "sessions_per_worker_peak": peak / workers,
    }


def one(args) -> None:
    """Measure one fleet size in this process (Django is set up once per database)."""
    if args.drain:
        result = drain(args.one, args.concurrency, args.drain, args.db, args.logdir)
    else:
        result = measure(args.one, args.concurrency, args.tasks, args.idle, args.db, args.logdir)
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,8,32", help="fleet sizes, comma-separated")
    parser.add_argument("--concurrency", type=int, default=4, help="--concurrency of each worker")
    parser.add_argument("--tasks", type=int, default=40, help="tasks enqueued one at a time")
    parser.add_argument("--idle", type=float, default=30, help="seconds of the idle window")
    parser.add_argument("--db", default="cairnq_bench_herd")
    parser.add_argument("--logdir", default="/tmp")
    parser.add_argument("--drain", type=int, default=0,
                        help="measure how fast each fleet drains this many queued tasks instead")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        return one(args)
    rows = []
    for n in [int(x) for x in args.workers.split(",")]:
        out = subprocess.run(
            [sys.executable, "-m", "bench.herd", "--one", str(n), "--concurrency", str(args.concurrency),
             "--tasks", str(args.tasks), "--idle", str(args.idle), "--db", args.db,
             "--drain", str(args.drain),
             "--logdir", args.logdir],
            cwd=ROOT, capture_output=True, text=True,
        )
        if out.returncode != 0:
            print(out.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"fleet of {n} failed")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    subprocess.run(["dropdb", *PG, "--if-exists", "--force", args.db], check=False)
    print()
    if args.drain:
        print(f"| workers | drain of {args.drain:,} (tasks/s) | once all had claimed (tasks/s) "
              "| tx per task | sessions/worker peak |")
        print("|---|---|---|---|---|")
        for r in rows:
            steady = f"{r['steady_rate']:.0f}" if r.get("steady_rate") else "-"
            print(f"| {r['workers']} | {r['drain_rate']:.0f} | {steady} | {r['xact_per_task']:.2f} "
                  f"| {r['sessions_per_worker_peak']:.2f} |")
        return
    print("| workers | idle tx/s per worker | tx per task | pickup p50 (ms) | pickup p95 (ms) "
          "| sessions/worker idle | sessions/worker peak |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['idle_xact_per_s_per_worker']:.2f} | {r['xact_per_task']:.2f} "
              f"| {r['pickup_p50_ms']:.1f} | {r['pickup_p95_ms']:.1f} "
              f"| {r['sessions_per_worker_idle']:.2f} | {r['sessions_per_worker_peak']:.2f} |")


if __name__ == "__main__":
    main()
