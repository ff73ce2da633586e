"""Measure worker start-up: spawn of `manage.py cairnq_worker --burst` to its first task done.

    bench/.venv/bin/python bench/startup.py [--runs 15] [--database-url URL] [--worker-arg ARG]

Runs the example project's worker (its own settings, DEBUG as it ships, so
--noreload is passed as --burst implies it) against a fresh database with one
queued no-op task (`flaky_fetch` succeeding on its first attempt), N times,
and prints the median and spread of

- spawn -> first claim: from just before the process is spawned to the task's
  completed_at_ms (the handler returns at once, so this is the first claim
  plus one settle), and
- the worker's CPU time (user+sys) for the whole run, which a busy machine
  disturbs far less than wall-clock time.

DATABASE_URL defaults to a SQLite file under /tmp; give a postgres:// URL to
measure PostgreSQL (the database is created if missing, migrated, and emptied
of tasks between runs).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = os.path.join(ROOT, "example_project")


def manage(env: dict[str, str], *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          check=True, **kwargs)


PREPARE = """
import cairnq_django
from cairnq_django.models import Task
Task.objects.all().delete()
cairnq_django.enqueue("flaky_fetch", {"succeed_on": 1})
"""

READ = """
import json
from cairnq_django.models import Task
task = Task.objects.get()
print(json.dumps({"status": task.status, "completed_at_ms": task.completed_at_ms}))
"""


def one_run(env: dict[str, str], worker_args: list[str]) -> tuple[float, float]:
    manage(env, "shell", "-c", PREPARE, stdout=subprocess.DEVNULL)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time()
    subprocess.run(
        [sys.executable, "manage.py", "cairnq_worker", "--burst", *worker_args],
        cwd=PROJECT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    output = manage(env, "shell", "-c", READ, capture_output=True, text=True).stdout
    found = json.loads(output.strip().splitlines()[-1])
    if found["status"] != "succeeded":
        raise SystemExit(f"The worker left the task {found['status']}; expected succeeded.")
    return found["completed_at_ms"] / 1000 - spawned, cpu


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--database-url", default="sqlite:////tmp/cairnq_startup.sqlite3")
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="extra argument for cairnq_worker (repeatable)")
    args = parser.parse_args()
    env = dict(os.environ, DATABASE_URL=args.database_url, PYTHONPATH=PROJECT)
    # Bytecode cached as in a deployed project (pip compiles on install): a
    # worker compiling every module from source would measure the compiler.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if args.database_url.startswith("postgres"):
        name = args.database_url.rsplit("/", 1)[1]
        subprocess.run(["createdb", "-h", "127.0.0.1", name], stderr=subprocess.DEVNULL)
    manage(env, "migrate", "-v0")
    manage(env, "cairnq_worker", "--burst", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    claims, cpus = [], []
    for _ in range(args.runs):
        claim, cpu = one_run(env, args.worker_arg)
        claims.append(claim)
        cpus.append(cpu)
    print(f"database: {args.database_url}; {args.runs} runs")
    print(f"spawn -> first task done: {summary(claims)}")
    print(f"worker CPU (user+sys), whole --burst run: {summary(cpus)}")


if __name__ == "__main__":
    main()
