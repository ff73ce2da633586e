"""Benchmark a retention sweep of a large backlog and its effect on a concurrent producer.

    .venv/bin/python bench/sweep_bench.py --backend sqlite --rows 1000000
    .venv/bin/python bench/sweep_bench.py --backend postgres --rows 1000000

Bulk-loads `--rows` finished tasks into a dedicated database (Postgres:
cairnq_sweep_bench, SQLite: a file in the temp dir; never the test database),
measures a producer process that enqueues one task at a time with no sweep
running (the baseline), then runs RetentionSweeper.sweep_once() over every row
while the same producer runs again. Reports the sweep's rows/s and the
producer's p50/p99/max enqueue latency in both phases. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_DB = "cairnq_sweep_bench"
SQLITE_PATH = os.path.join(tempfile.gettempdir(), "cairnq_sweep_bench.sqlite3")
DAY_MS = 86_400_000


def configure(backend: str) -> None:
    """Point Django at the bench database (in this process or a producer child)."""
    sys.path.insert(0, ROOT)
    import django
    from django.conf import settings

    if backend == "postgres":
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": PG_DB,
            "USER": os.environ.get("PGUSER", "root"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    else:
        database = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
            },
        }
    settings.configure(
        DATABASES={"default": database},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "cairnq_django"],
        USE_TZ=True,
        CAIRNQ={},
    )
    django.setup()


def recreate_database(backend: str) -> None:
    """Start from an empty, migrated bench database."""
    if backend == "postgres":
        import psycopg

        with psycopg.connect(
            dbname="postgres", user=os.environ.get("PGUSER", "root"),
            host=os.environ.get("PGHOST", "127.0.0.1"), autocommit=True,
        ) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {PG_DB}")
            conn.execute(f"CREATE DATABASE {PG_DB}")
    else:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(SQLITE_PATH + suffix):
                os.unlink(SQLITE_PATH + suffix)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def load(backend: str, rows: int) -> float:
    """Insert `rows` finished tasks completed two days ago; return the seconds it took."""
    from django.db import connection

    from cairnq_django.ids import now_ms

    base = now_ms() - 2 * DAY_MS
    started = time.perf_counter()
    if backend == "postgres":
        # One INSERT ... SELECT: the server generates the rows.
        sql = """
            INSERT INTO cairnq_tasks (id, name, queue, status, payload, result, metadata,
                attempt, max_attempts, priority, run_at_ms, root_id, created_at_ms,
                updated_at_ms, completed_at_ms, worker_id)
            SELECT 'task_bench' || lpad(i::text, 16, '0'),
                   'bench.job' || (i %% 5), CASE WHEN i %% 4 = 0 THEN 'bulk' ELSE 'default' END,
                   CASE WHEN i %% 10 < 7 THEN 'succeeded' WHEN i %% 10 < 9 THEN 'failed'
                        ELSE 'canceled' END,
                   jsonb_build_object('n', i, 'pad', repeat('x', 80)),
                   CASE WHEN i %% 10 < 7 THEN jsonb_build_object('ok', true) END,
                   '{}'::jsonb, 1, 3, 0, %(base)s + i, 'task_bench' || lpad(i::text, 16, '0'),
                   %(base)s + i, %(base)s + i, %(base)s + i, 'bench-worker'
            FROM generate_series(1, %(rows)s) AS i
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, {"rows": rows, "base": base})
            cursor.execute("VACUUM ANALYZE cairnq_tasks")
    else:
        connection.ensure_connection()
        raw = connection.connection  # the sqlite3 connection itself, for executemany
        pad = "x" * 80
        statuses = ["succeeded"] * 7 + ["failed"] * 2 + ["canceled"]

        def chunk(start: int, stop: int):
            for i in range(start, stop):
                task_id = f"task_bench{i:016d}"
                status = statuses[i % 10]
                yield (
                    task_id, f"bench.job{i % 5}", "bulk" if i % 4 == 0 else "default", status,
                    json.dumps({"n": i, "pad": pad}),
                    '{"ok": true}' if status == "succeeded" else None,
                    base + i, task_id, base + i, base + i, base + i,
                )

        sql = (
            "INSERT INTO cairnq_tasks (id, name, queue, status, payload, result, metadata,"
            " attempt, max_attempts, priority, run_at_ms, root_id, created_at_ms,"
            " updated_at_ms, completed_at_ms, worker_id)"
            " VALUES (?, ?, ?, ?, ?, ?, '{}', 1, 3, 0, ?, ?, ?, ?, ?, 'bench-worker')"
        )
        step = 50_000
        raw.execute("BEGIN")
        for start in range(1, rows + 1, step):
            raw.executemany(sql, chunk(start, min(start + step, rows + 1)))
        raw.execute("COMMIT")
        raw.execute("ANALYZE cairnq_tasks")
    return time.perf_counter() - started


def produce(backend: str, interval_ms: float, ready, stop, results) -> None:
    """Enqueue one task at a time until `stop` is set; send back each enqueue's latency (s)."""
    configure(backend)
    from cairnq_django.client import enqueue

    enqueue("bench.warmup", {})
    latencies = []
    ready.set()
    while not stop.is_set():
        started = time.perf_counter()
        enqueue("bench.produce", {"n": len(latencies)})
        latencies.append(time.perf_counter() - started)
        if interval_ms:
            time.sleep(interval_ms / 1000)
    results.put(latencies)


class Producer:
    """A producer in its own process, so it shares no GIL or connection with the sweep."""

    def __init__(self, backend: str, interval_ms: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop_event, self.results = ctx.Event(), ctx.Event(), ctx.Queue()
        self.process = ctx.Process(
            target=produce,
            args=(backend, interval_ms, self.ready, self.stop_event, self.results),
        )

    def __enter__(self) -> Producer:
        self.process.start()
        if not self.ready.wait(120):
            raise RuntimeError("The producer process did not start.")
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.latencies = self.results.get(timeout=120)
        self.process.join(60)


def summarize(latencies: list[float]) -> dict:
    ms = sorted(x * 1000 for x in latencies)
    if not ms:
        return {"enqueues": 0}

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(round(p / 100 * (len(ms) - 1))))]

    return {
        "enqueues": len(ms),
        "p50_ms": round(pct(50), 2),
        "p99_ms": round(pct(99), 2),
        "max_ms": round(ms[-1], 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def server_version(backend: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        if backend == "postgres":
            cursor.execute("SHOW server_version")
            return "PostgreSQL " + cursor.fetchone()[0]
        cursor.execute("SELECT sqlite_version()")
        return "SQLite " + cursor.fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], required=True)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--pause-ms", type=int, default=50)
    parser.add_argument("--producer-interval-ms", type=float, default=5.0,
                        help="Sleep between the producer's enqueues.")
    parser.add_argument("--baseline-seconds", type=float, default=15.0)
    parser.add_argument("--json", action="store_true", help="Print the result as JSON only.")
    args = parser.parse_args()

    configure(args.backend)
    from django.db import connection

    from cairnq_django.retention import RetentionSweeper

    def say(msg: str) -> None:
        if not args.json:
            print(msg, flush=True)

    recreate_database(args.backend)
    say(f"Loading {args.rows:,} finished tasks into {args.backend} ...")
    load_s = load(args.backend, args.rows)
    say(f"  loaded in {load_s:.1f} s")

    say(f"Baseline: producer alone for {args.baseline_seconds:.0f} s ...")
    with Producer(args.backend, args.producer_interval_ms) as baseline:
        time.sleep(args.baseline_seconds)
    baseline_stats = summarize(baseline.latencies)

    say("Sweep with the producer running ...")
    sweeper = RetentionSweeper(
        rules=DAY_MS, batch_size=args.batch_size, pause_ms=args.pause_ms,
    )
    with Producer(args.backend, args.producer_interval_ms) as during:
        started = time.perf_counter()
        results = sweeper.sweep_once()
        sweep_s = time.perf_counter() - started
    deleted = sum(r.deleted for r in results)
    batches = sum(r.batches for r in results)
    with connection.cursor() as cursor:
        cursor.execute("SELECT status, COUNT(*) FROM cairnq_tasks GROUP BY status")
        left = dict(cursor.fetchall())

    report = {
        "backend": args.backend,
        "server": server_version(args.backend),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "rows": args.rows,
        "load_s": round(load_s, 1),
        "batch_size": args.batch_size,
        "pause_ms": args.pause_ms,
        "producer_interval_ms": args.producer_interval_ms,
        "deleted": deleted,
        "batches": batches,
        "sweep_s": round(sweep_s, 1),
        "rows_per_s": round(deleted / sweep_s) if sweep_s else None,
        "rows_per_s_excluding_pauses": round(
            deleted / max(1e-9, sweep_s - batches * args.pause_ms / 1000)
        ),
        "rows_left": left,
        "producer_baseline": baseline_stats,
        "producer_during_sweep": summarize(during.latencies),
    }
    connection.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    b, d = report["producer_baseline"], report["producer_during_sweep"]
    print(
        f"\n{report['server']} on {report['machine']}\n"
        f"Swept {deleted:,} rows in {sweep_s:.1f} s ({batches} batches of {args.batch_size},"
        f" {args.pause_ms} ms pause): {report['rows_per_s']:,} rows/s"
        f" ({report['rows_per_s_excluding_pauses']:,} rows/s excluding pauses)\n"
        f"Rows left: {left}\n"
        f"Producer enqueue latency, baseline: p50 {b['p50_ms']} ms, p99 {b['p99_ms']} ms,"
        f" max {b['max_ms']} ms ({b['enqueues']} enqueues)\n"
        f"Producer enqueue latency, during sweep: p50 {d['p50_ms']} ms, p99 {d['p99_ms']} ms,"
        f" max {d['max_ms']} ms ({d['enqueues']} enqueues)\n"
        + json.dumps(report)
    )


if __name__ == "__main__":
    main()
