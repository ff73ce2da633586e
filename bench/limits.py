"""The database's own limit: single-row INSERT + COMMIT from one client."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import tempfile
import time

PG = ["-h", "127.0.0.1", "-U", os.environ.get("PGUSER", "root")]


def postgres_commits_per_s(seconds: float, dbname: str) -> float:
    """Run pgbench with one client doing autocommitted single-row INSERTs."""
    subprocess.run(["dropdb", *PG, "--if-exists", dbname], check=True)
    subprocess.run(["createdb", *PG, dbname], check=True)
    subprocess.run(
        ["psql", *PG, "-q", "-d", dbname, "-c",
         "CREATE TABLE limit_probe (id bigserial PRIMARY KEY, v text NOT NULL)"],
        check=True,
    )
    try:
        return _pgbench_tps("INSERT INTO limit_probe (v) VALUES ('x');\n", seconds, dbname)
    finally:
        subprocess.run(["dropdb", *PG, "--if-exists", dbname], check=True)


def _pgbench_tps(statement: str, seconds: float, dbname: str) -> float:
    """Transactions per second of one pgbench client running `statement` for `seconds`."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(statement)
    try:
        out = subprocess.run(
            ["pgbench", *PG, "-n", "-c", "1", "-j", "1", "-T", str(int(seconds)),
             "-f", script.name, dbname],
            check=True, capture_output=True, text=True,
        ).stdout
    finally:
        os.unlink(script.name)
    return float(re.search(r"tps = ([0-9.]+)", out).group(1))


def sqlite_commits_per_s(seconds: float, directory: str) -> float:
    """Commit single-row INSERTs through Python's sqlite3 in WAL (synchronous=NORMAL)."""
    path = os.path.join(directory, "limit_probe.sqlite3")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE limit_probe (id integer PRIMARY KEY, v text NOT NULL)")
    n, deadline = 0, time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < deadline:
        for _ in range(100):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO limit_probe (v) VALUES ('x')")
            conn.execute("COMMIT")
        n += 100
    rate = n / (time.monotonic() - start)
    conn.close()
    return rate


# The protocol's task row as enqueue() writes it: its ten indexes, and on
# PostgreSQL the NOTIFY trigger, are what W1 pays beyond the bare INSERT above.
_ROW_COLUMNS = (
    "id, name, queue, status, payload, metadata, max_attempts, priority, run_at_ms,"
    " root_id, created_at_ms, updated_at_ms"
)
_PG_NOW_MS = "(extract(epoch from statement_timestamp()) * 1000)::bigint"
_PG_ROW = (
    f"INSERT INTO cairnq_tasks ({_ROW_COLUMNS}) VALUES (md5(random()::text), 'noop',"
    f" 'default', 'queued', '{{}}'::jsonb, '{{}}'::jsonb, 3, 0, {_PG_NOW_MS}, 'limit',"
    f" {_PG_NOW_MS}, {_PG_NOW_MS}) RETURNING created_at_ms;\n"
)


def protocol_row_per_s(backend: str, db: str, seconds: float) -> float:
    """One client committing single protocol task rows into `db`, a migrated copy of ours."""
    if backend == "postgres":
        return _pgbench_tps(_PG_ROW, seconds, db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    insert = (
        f"INSERT INTO cairnq_tasks ({_ROW_COLUMNS}) VALUES (?, 'noop', 'default', 'queued',"
        " '{}', '{}', 3, 0, ?, 'limit', ?, ?) RETURNING created_at_ms"
    )
    n, deadline = 0, time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < deadline:
        for _ in range(100):
            now = int(time.time() * 1000)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(insert, (f"limit-{n}-{now}-{time.perf_counter_ns()}", now, now, now)).fetchall()
            conn.execute("COMMIT")
            n += 1
    rate = n / (time.monotonic() - start)
    conn.close()
    return rate
