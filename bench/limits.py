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
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("INSERT INTO limit_probe (v) VALUES ('x');\n")
    try:
        out = subprocess.run(
            ["pgbench", *PG, "-n", "-c", "1", "-j", "1", "-T", str(int(seconds)),
             "-f", script.name, dbname],
            check=True, capture_output=True, text=True,
        ).stdout
    finally:
        os.unlink(script.name)
        subprocess.run(["dropdb", *PG, "--if-exists", dbname], check=True)
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
