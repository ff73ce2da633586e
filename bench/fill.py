"""Put filler rows into cairnq_tasks with one INSERT ... SELECT (for W5).

Queued fillers are runnable no-ops older than anything enqueued after them;
succeeded fillers are named 'filler' so the drain probe ignores them.
"""

import time

from django.db import connection, transaction


def fill(rows: int, status: str) -> None:
    """Insert `rows` tasks in `status` ('queued' or 'succeeded')."""
    if rows <= 0:
        return
    # Every filler row lies in the past, its clocks ending a minute ago.
    now = int(time.time() * 1000) - 60_000 - rows
    name = "noop" if status == "queued" else "filler"
    completed = "NULL" if status == "queued" else f"{now} + i"
    if connection.vendor == "postgresql":
        series = "generate_series(1, %(rows)s) AS i"
        ident = "'fill-' || lpad(i::text, 8, '0')"
        payload = "'{}'::jsonb"
    else:
        series = (
            "(WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s"
            " WHERE i < %(rows)s) SELECT i FROM s)"
        )
        ident = "printf('fill-%%08d', i)"
        payload = "'{}'"
    sql = (
        "INSERT INTO cairnq_tasks (id, name, queue, status, payload, metadata, attempt,"
        " max_attempts, priority, run_at_ms, root_id, created_at_ms, updated_at_ms,"
        " completed_at_ms)"
        f" SELECT {ident}, '{name}', 'default', '{status}', {payload}, {payload},"
        f" {0 if status == 'queued' else 1}, 3, 0, {now} + i, {ident}, {now} + i,"
        f" {now} + i, {completed} FROM {series}"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, {"rows": rows})
    with connection.cursor() as cursor:
        # Steady state, as a table that has held these rows for a while: on
        # Postgres, VACUUM now rather than autovacuum's pass over a million
        # fresh rows landing in the middle of the measurement.
        cursor.execute(
            "VACUUM ANALYZE cairnq_tasks" if connection.vendor == "postgresql"
            else "ANALYZE cairnq_tasks"
        )
