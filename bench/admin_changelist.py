"""Time the task admin on a large table: `python -m bench.admin_changelist --backend postgres`.

Loads ROWS synthetic tasks (one multi-row INSERT ... SELECT per chunk, generated
by the database itself) into a database of its own, never the test databases,
then requests the changelist, a filtered changelist, a search, a detail page and
the stats page through Django's test client and prints the median of several
requests. Run it from the repository root with the project's venv.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

STATUS_MIX = (
    # (status, share of rows): mostly finished work, as in a real table.
    ("succeeded", 0.90),
    ("failed", 0.04),
    ("canceled", 0.02),
    ("queued", 0.03),
    ("running", 0.01),
)
QUEUES = 5
NAMES = 20


def _configure(backend: str, db: str) -> None:
    os.environ["CAIRNQ_TEST_DATABASE"] = backend
    os.environ["CAIRNQ_CHILD_DB_NAME"] = db
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    if backend == "postgres":
        import psycopg

        with psycopg.connect(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            user=os.environ.get("PGUSER", "root"),
            dbname="postgres",
            autocommit=True,
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{db}"')
    import django

    django.setup()


def _status_sql(i: str) -> str:
    """A CASE that spreads STATUS_MIX over the row number `i`."""
    parts, edge = [], 0
    for status, share in STATUS_MIX:
        edge += round(share * 100)
        parts.append(f"WHEN ({i}) % 100 < {edge} THEN '{status}'")
    return "CASE " + " ".join(parts) + " END"


def _load(rows: int, chunk: int = 100_000) -> None:
    """Insert `rows` tasks created over the last 30 days, 10% of them keyed."""
    from django.db import connection, transaction

    now = int(time.time() * 1000)
    span = 30 * 24 * 3600 * 1000
    vendor = connection.vendor
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_tasks")
        have = cursor.fetchone()[0]
    for start in range(have, rows, chunk):
        stop = min(rows, start + chunk)
        if vendor == "postgresql":
            source = f"generate_series({start}::bigint, {stop - 1}) AS g(i)"
            pad = "lpad(({c})::text, 13, '0')"
            json = "::jsonb"
        else:
            source = (
                f"(WITH RECURSIVE g(i) AS (SELECT {start} UNION ALL SELECT i + 1 FROM g"
                f" WHERE i < {stop - 1}) SELECT i FROM g) AS g"
            )
            pad = "substr('0000000000000' || ({c}), -13, 13)"
            json = ""
        created = f"({now - span} + i * {span // rows})"
        status = _status_sql("i")
        task_id = f"'task_' || {pad.format(c=created)} || {pad.format(c='i')}"
        finished = f"{status} IN ('succeeded', 'failed', 'canceled')"
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO cairnq_tasks (id, name, queue, status, payload, metadata, attempt,"
                " max_attempts, progress, worker_id, lease_until_ms, run_at_ms, parent_id, root_id,"
                " correlation_id, created_at_ms, updated_at_ms, completed_at_ms)"
                f" SELECT {task_id}, 'job.n' || (i % {NAMES}), 'q' || (i % {QUEUES}), {status},"
                f" '{{\"n\": 1}}'{json}, '{{}}'{json}, 1, 3,"
                f" CASE WHEN {status} = 'running' THEN 0.5 END,"
                f" CASE WHEN {status} = 'running' THEN 'bench-worker' END,"
                f" CASE WHEN {status} = 'running' THEN {now} + 3600000 END,"
                f" {created}, NULL, {task_id}, 'corr-' || (i / 10),"
                f" {created}, {created} + 1500,"
                f" CASE WHEN {finished} THEN {created} + 1500 END"
                f" FROM {source}"
            )
            cursor.execute(
                "INSERT INTO cairnq_task_keys (key, task_id, created_at_ms, updated_at_ms)"
                f" SELECT 'key-' || i, {task_id}, {created}, {created}"
                f" FROM {source} WHERE i % 10 = 0"
            )
        print(f"loaded {stop:,} rows", file=sys.stderr)
    with connection.cursor() as cursor:
        # A settled table: planner statistics, and (Postgres) a visibility
        # map so counts can be answered from indexes.
        cursor.execute("VACUUM ANALYZE cairnq_tasks" if vendor == "postgresql" else "ANALYZE")


def _time(client, url: str, repeat: int, show_queries: bool) -> tuple[float, float, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    samples = []
    status = 0
    for _ in range(repeat + 1):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url)
            samples.append(time.perf_counter() - started)
        status = response.status_code
    if show_queries:
        for query in sorted(queries.captured_queries, key=lambda q: -float(q["time"]))[:4]:
            print(f"      {float(query['time']) * 1000:7.1f} ms  {query['sql'][:160]}")
    warm = samples[1:]
    return statistics.median(warm) * 1000, min(warm) * 1000, status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--queries", action="store_true", help="print each page's slowest SQL")
    parser.add_argument(
        "--db",
        help="database name (postgres) or file (sqlite); default cq_admin_bench",
    )
    args = parser.parse_args(argv)
    db = args.db or (
        "cq_admin_bench"
        if args.backend == "postgres"
        else os.path.join(tempfile.gettempdir(), "cq_admin_bench.sqlite3")
    )
    _configure(args.backend, db)

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import override_settings

    call_command("migrate", verbosity=0)
    _load(args.rows)
    # Not setup_test_environment(): its instrumented template rendering
    # copies every context and would dominate the timings.
    override_settings(ALLOWED_HOSTS=["testserver"]).enable()
    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    base = "/admin/cairnq_django/task/"
    from cairnq_django.models import Task

    some_id = Task.objects.order_by("-id").values_list("id", flat=True)[:1][0]
    pages = [
        ("changelist", base),
        ("changelist, page 50", base + "?p=50"),
        ("status=queued", base + "?status__exact=queued"),
        ("status=failed, queue=q1", base + "?status__exact=failed&queue=q1"),
        ("name=job.n7", base + "?name=job.n7"),
        ("search by id", base + f"?q={some_id}"),
        ("search by key", base + "?q=key-500"),
        ("detail", base + f"{some_id}/change/"),
        ("stats", base + "stats/"),
    ]
    print(f"{args.backend}, {args.rows:,} rows, {args.repeat} warm requests per page")
    for label, url in pages:
        median, best, status = _time(client, url, args.repeat, args.queries)
        print(f"  {label:<24} median {median:7.1f} ms   best {best:7.1f} ms   (HTTP {status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
