"""Side-by-side benchmark of cairnq_django and its peers; run it through `bench/run`.

Every cell (system x backend x workload) runs in its own process on a fresh
database copied from a migrated per-system template, repeats `--reps` times,
and is reported as median (min-max), as a ratio to the best peer and to the
database's single-client commit limit measured in the same run.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys

from . import limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG = limits.PG
SYSTEMS = [
    "cairnq_django", "django_tasks_db", "procrastinate", "cairnq", "celery", "pgqueuer", "huey", "django_q2",
]
# PostgreSQL-only peers sit the SQLite runs out; Celery's broker is Redis on both.
POSTGRES_ONLY = {"procrastinate", "pgqueuer"}
BASELINE = "baseline"  # the system name of `--baseline REF`: ours at REF
BACKENDS = ["sqlite", "postgres"]
WORKLOADS = ["w1", "w1b", "w2", "w2t", "w3", "w4", "w5", "w6"]

# Volumes: (full, --quick).
VOLUMES = {
    "w1": (5_000, 500),
    "w1b": (50_000, 5_000),
    "w2": (5_000, 500),
    "w3": (30, 10),
    "w4": (30, 10),
    "w6": (30, 10),
    "w5_small": (1_000, 1_000),
    "w5_large": (1_000_000, 20_000),
    "w5_drain": (3_000, 400),
    "w5_claims": (200, 50),
}

# Settings tried for W2 "tuned", per system; the best by one run gets the reps.
TUNING = {
    "cairnq_django": ["--concurrency 16", "--concurrency 32"],
    "django_tasks_db": ["CONN_MAX_AGE=none --no-startup-delay"],
    "procrastinate": ["--concurrency 8", "--concurrency 32"],
    "cairnq": ["--concurrency 8", "--concurrency 32"],
    "celery": ["--concurrency 8", "--pool threads --concurrency 32"],
    "pgqueuer": ["--batch-size 100", "--batch-size 100 --max-concurrent-tasks 32"],
    "huey": ["-w 4 -k thread", "-w 8 -k thread"],
    "django_q2": ["WORKERS=8"],
}
# Peers without a bulk API sit W1b out ("their bulk API where they have one").
NO_BULK_API = {"django_tasks_db", "cairnq", "celery", "huey", "django_q2"}
# Peers without a blocking call (or without a result backend here) sit W4 out.
NO_CALL = {"celery", "pgqueuer", "huey", "django_q2"}
DEFAULT_LABEL = {
    "cairnq_django": "concurrency 8",
    "django_tasks_db": "1 task at a time, interval 1 s",
    "procrastinate": "concurrency 1",
    "cairnq": "concurrency 1",
    "celery": "prefork, 2 processes (one per core), prefetch 4",
    "pgqueuer": "batch 10",
    "huey": "1 thread worker",
    "django_q2": "ORM broker, 2 workers (one per core)",
}


def log(msg: str) -> None:
    print(msg, flush=True)


class Databases:
    """Fresh, migrated databases per cell: Postgres via createdb -T, SQLite by file copy."""

    def __init__(self, workdir: str, baseline_code: str | None = None) -> None:
        self.workdir = workdir
        self.baseline_code = baseline_code
        os.makedirs(workdir, exist_ok=True)

    def _pg(self, *args: str) -> None:
        subprocess.run([args[0], *PG, *args[1:]], check=True, capture_output=True)

    def template(self, system: str, backend: str) -> None:
        name = self.name(system, backend, template=True)
        if backend == "postgres":
            self._pg("dropdb", "--if-exists", name)
            self._pg("createdb", name)
        else:
            self._unlink(name)
        env = self.env(system, backend, name)
        if system == "pgqueuer":
            env["PGQUEUER_DSN"] = f"postgresql://{os.environ.get('PGUSER', 'root')}@127.0.0.1:5432/{name}"
            cmd = [sys.executable, "-m", "pgqueuer", "install"]
        elif system in ("celery", "huey"):
            cmd = None  # Celery's broker is Redis; Huey creates its tables on first use
            if backend == "sqlite":
                open(name, "w").close()
        elif system == "cairnq":
            code = (
                "import asyncio, os\n"
                "from bench.cairnq_sdk import client\n"
                "async def go():\n"
                "    c = client(os.environ['BENCH_BACKEND'], os.environ['BENCH_DB'])\n"
                "    await c.connect()\n"
                "    await c.close()\n"
                "asyncio.run(go())\n"
            )
            cmd = [sys.executable, "-c", code]
        else:
            cmd = [sys.executable, "-m", "django", "migrate", "-v", "0"]
        if cmd is not None:
            subprocess.run(cmd, cwd=self.cwd(system), env=env, check=True, stdout=subprocess.DEVNULL)
        if backend == "sqlite" and os.path.exists(name):
            _checkpoint(name)

    def derive(self, system: str, backend: str, suffix: str) -> str:
        """Copy the template to a second template (W5's filled tables); return its name."""
        base = self.name(system, backend, template=True)
        name = base.replace("_tpl", f"_tpl{suffix}")
        if backend == "postgres":
            self._pg("dropdb", "--if-exists", name)
            self._pg("createdb", "-T", base, name)
        else:
            self._unlink(name)
            shutil.copyfile(base, name)
        return name

    def fresh(self, system: str, backend: str, template: str | None = None) -> str:
        name = self.name(system, backend)
        tpl = template or self.name(system, backend, template=True)
        if backend == "postgres":
            self._pg("dropdb", "--if-exists", name)
            self._pg("createdb", "-T", tpl, name)
        else:
            self._unlink(name)
            shutil.copyfile(tpl, name)
        return name

    def drop_all(self, system: str, backend: str) -> None:
        for template in (False, True, "_w5"):
            name = self.name(system, backend, template=bool(template))
            if template == "_w5":
                name = name.replace("_tpl", "_tpl_w5")
            if backend == "postgres":
                self._pg("dropdb", "--if-exists", name)
            else:
                self._unlink(name)

    def name(self, system: str, backend: str, template: bool = False) -> str:
        base = f"cairnq_bench_{system}" + ("_tpl" if template else "")
        if backend == "postgres":
            return base
        return os.path.join(self.workdir, base + ".sqlite3")

    def _unlink(self, path: str) -> None:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)

    def cwd(self, system: str) -> str:
        """Where a system's processes start: `python -m` puts that directory first on sys.path."""
        return self.baseline_code if system == BASELINE and self.baseline_code else ROOT

    def env(self, system: str, backend: str, db: str) -> dict:
        path = ROOT
        if system == BASELINE:
            # Ours at the baseline commit: its package ahead of this tree's,
            # everything else (bench code, settings, peers) the same.
            system, path = "cairnq_django", f"{self.baseline_code}{os.pathsep}{ROOT}"
        return dict(
            os.environ,
            BENCH_SYSTEM=system,
            BENCH_BACKEND=backend,
            BENCH_DB=db,
            BENCH_LOG_DIR=self.workdir,
            DJANGO_SETTINGS_MODULE="bench.project.settings",
            PYTHONPATH=path,
        )


def _checkpoint(path: str) -> None:
    """Fold SQLite's WAL into the main file so a plain copy is complete."""
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def run_cell(
    dbs: Databases, system: str, backend: str, args: list[str], template: str | None = None
) -> dict:
    """Run one repetition of a cell in a child process on a fresh database."""
    db = dbs.fresh(system, backend, template)
    out = subprocess.run(
        [sys.executable, "-m", "bench.cell", *args],
        cwd=dbs.cwd(system), env=dbs.env(system, backend, db), capture_output=True, text=True,
    )
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-6:])
        raise RuntimeError(f"{system}/{backend} {' '.join(args)} failed:\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    """Median, min and max of every numeric field over the repetitions."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {
        k: {
            "median": statistics.median(r[k] for r in runs),
            "min": min(r[k] for r in runs),
            "max": max(r[k] for r in runs),
        }
        for k in keys
    }


def cell_args(workload: str, quick: bool) -> list[list[str]]:
    """The cell invocations of a workload (W5 has several variants)."""
    v = {k: str(val[1] if quick else val[0]) for k, val in VOLUMES.items()}
    if workload == "w5":
        base = ["w5", "--n", v["w5_drain"], "--claims", v["w5_claims"]]
        return [
            [*base, "--rows", v["w5_small"], "--filler", "queued"],
            [*base, "--rows", v["w5_large"], "--filler", "queued"],
            [*base, "--rows", v["w5_large"], "--filler", "succeeded"],
        ]
    return [[workload.rstrip("t") if workload == "w2t" else workload, "--n", v[workload.rstrip("t")]]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small volumes, 1 repetition")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per cell (default 3)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--limit-seconds", type=float, default=None)
    parser.add_argument("--workdir", default="/tmp/cairnq_bench")
    parser.add_argument("--baseline", metavar="REF", default=None,
                        help="also run ours at git commit REF (its cairnq_django/ package only),"
                             " taking turns with ours rep by rep in every cell but W5, for a"
                             " before/after in one run")
    parser.add_argument("--tune", metavar="SETTINGS", default=None,
                        help="W2t's candidate settings for ours, ';'-separated (default: "
                             + "; ".join(TUNING["cairnq_django"]) + "); one setting skips the"
                             " trial runs, e.g. --tune '--concurrency 32'")
    parser.add_argument("--write-docs", action="store_true",
                        help="replace the results in docs/benchmarks.md (and, for a run of both"
                             " backends, the README table)")
    opts = parser.parse_args()
    if opts.tune:
        TUNING["cairnq_django"] = [t.strip() for t in opts.tune.split(";") if t.strip()]
    reps = opts.reps or (1 if opts.quick else 3)
    backends = opts.backends.split(",")
    systems = opts.systems.split(",")
    workloads = opts.workloads.split(",")
    baseline_ref = baseline_code = None
    if opts.baseline:
        baseline_ref, baseline_code = _extract_baseline(opts.baseline, opts.workdir)
    compile_checkouts(baseline_code)
    dbs = Databases(opts.workdir, baseline_code)
    limit_s = opts.limit_seconds or (3 if opts.quick else 10)
    started = dt.datetime.now(dt.UTC)
    results: dict = {
        "started": started.isoformat(timespec="seconds"),
        "command": "bench/run " + " ".join(sys.argv[1:]),
        "machine": _machine(),
        "reps": reps,
        "baseline": baseline_ref,
        "limits": {},
        "cells": [],
    }
    for backend in backends:
        log(f"== {backend}: single-client INSERT+COMMIT limit")
        if backend == "postgres":
            rates = [limits.postgres_commits_per_s(limit_s, "cairnq_bench_limit") for _ in range(reps)]
        else:
            rates = [limits.sqlite_commits_per_s(limit_s, opts.workdir) for _ in range(reps)]
        results["limits"][backend] = summarize([{"rate": r} for r in rates])["rate"]
        log(f"   {results['limits'][backend]['median']:.0f} commits/s")
        if "cairnq_django" in systems:
            log(f"== {backend}: single-client limit for the protocol's task row")
            dbs.template("cairnq_django", backend)
            probe = dbs.fresh("cairnq_django", backend)
            rates = [limits.protocol_row_per_s(backend, probe, limit_s) for _ in range(reps)]
            results.setdefault("row_limits", {})[backend] = summarize([{"rate": r} for r in rates])["rate"]
            log(f"   {results['row_limits'][backend]['median']:.0f} commits/s")
        for system in systems:
            if system in POSTGRES_ONLY and backend == "sqlite":
                continue
            # Ours and the baseline take turns, repetition by repetition, so a
            # change in the machine's load lands on both.
            partners = [BASELINE] if baseline_code and system == "cairnq_django" else []
            for who in (system, *partners):
                log(f"== {backend}/{who}: migrating template")
                dbs.template(who, backend)
            for workload in workloads:
                if workload == "w5" and system != "cairnq_django":
                    continue
                if workload == "w1b" and system in NO_BULK_API:
                    continue
                if workload == "w4" and system in NO_CALL:
                    continue
                for args in cell_args(workload, opts.quick):
                    template = None
                    if workload == "w5":
                        # Fill once; every repetition copies the filled database.
                        rows, filler = args[args.index("--rows") + 1], args[args.index("--filler") + 1]
                        template = dbs.derive(system, backend, "_w5")
                        subprocess.run(
                            [sys.executable, "-m", "bench.cell", "fill", "--rows", rows,
                             "--filler", filler],
                            cwd=dbs.cwd(system), env=dbs.env(system, backend, template), check=True,
                        )
                        if backend == "sqlite":
                            _checkpoint(template)
                        args = [*args, "--prefilled"]
                    settings = [None]
                    if workload == "w2t":
                        settings = _tune(dbs, system, backend, args)
                    # W5's million rows are filled for ours only; the baseline
                    # runs every other cell at ours' (tuned) setting.
                    turns = (system,) if workload == "w5" else (system, *partners)
                    for setting in settings:
                        full = args + (["--setting", setting] if setting else [])
                        runs: dict[str, list[dict]] = {who: [] for who in turns}
                        failed: set[str] = set()  # a system that failed sits the rest out
                        for _ in range(reps):
                            for who in turns:
                                if who in failed:
                                    continue
                                try:
                                    runs[who].append(run_cell(dbs, who, backend, full, template))
                                except RuntimeError as exc:
                                    log(f"   ERROR {exc}")
                                    failed.add(who)
                        for who, done in runs.items():
                            if not done:
                                continue
                            summary = summarize(done)
                            cell = {
                                "backend": backend, "system": who, "workload": workload,
                                "args": full, "setting": setting, "summary": summary,
                                "runs": done,
                            }
                            results["cells"].append(cell)
                            log(f"   {who} {workload} {' '.join(full[1:])}: {_brief(summary)}")
                            _save_partial(results, started)
            for who in (system, *partners):
                dbs.drop_all(who, backend)
    results["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    from .report import render

    table = render(results)
    print(table)
    with open(_result_path(started, ".json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(_result_path(started, ".md"), "w") as f:
        f.write(table)
    with contextlib.suppress(FileNotFoundError):
        os.remove(_result_path(started, ".partial.json"))
    if opts.write_docs:
        from .report import write_docs, write_readme

        write_docs(os.path.join(ROOT, "docs", "benchmarks.md"), table)
        # Only a run of both backends replaces the README's table.
        if set(results["limits"]) == {"sqlite", "postgres"}:
            write_readme(os.path.join(ROOT, "README.md"), results)
    log(f"results: {os.path.relpath(_result_path(started, '.json'), ROOT)}")


def _result_path(started: dt.datetime, suffix: str) -> str:
    """A file of this run under bench/results/, named by its start time."""
    out_dir = os.path.join(ROOT, "bench", "results")
    os.makedirs(out_dir, exist_ok=True)
    return os.path.join(out_dir, started.strftime("%Y%m%dT%H%M%SZ") + suffix)


def _save_partial(results: dict, started: dt.datetime) -> None:
    """Keep what a long run has measured so far, so a run cut short still leaves its cells."""
    path = _result_path(started, ".partial.json")
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


def compile_checkouts(*more: str | None) -> None:
    """Write the bytecode of the code the cells run from a checkout, as pip does at install.

    Every peer comes from PyPI, and pip compiled it when it installed it; ours
    (editable) and the bench's own modules are source files. Where
    PYTHONDONTWRITEBYTECODE is set (this machine's shells set it) nothing
    ever writes their .pyc, so each spawned worker would compile about 24,000
    lines of our package before its first claim, a cost no installed copy pays.
    """
    for tree in (os.path.join(ROOT, "cairnq_django"), os.path.join(ROOT, "bench"), *filter(None, more)):
        compileall.compile_dir(tree, quiet=1, rx=re.compile(r"[/\\]\.venv"))


def _extract_baseline(ref: str, workdir: str) -> tuple[str, str]:
    """Write REF's cairnq_django/ into the workdir; return (short commit id, directory)."""
    commit = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    target = os.path.join(workdir, f"baseline-{commit}")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    archive = subprocess.run(["git", "archive", commit, "cairnq_django"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", target], input=archive, check=True)
    return commit, target


def _tune(dbs: Databases, system: str, backend: str, args: list[str]) -> list[str]:
    """Try each tuning candidate once; return the fastest as a one-item list."""
    candidates = TUNING.get("cairnq_django" if system == BASELINE else system, [])
    if len(candidates) == 1:
        return candidates  # nothing to choose between
    best, best_rate = None, -1.0
    for setting in candidates:
        try:
            rate = run_cell(dbs, system, backend, [*args, "--setting", setting])["rate"]
        except RuntimeError as exc:
            log(f"   tuning {setting!r} failed: {exc}")
            continue
        log(f"   tuning {setting}: {rate:.0f}/s")
        if rate > best_rate:
            best, best_rate = setting, rate
    return [best] if best else []


def _machine() -> str:
    """Cores, OS, Python and (when reachable) the PostgreSQL server version."""
    text = f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}"
    try:
        version = subprocess.run(
            ["psql", *PG, "-d", "postgres", "-Atc", "SHOW server_version"],
            capture_output=True, text=True, check=True,
        ).stdout.split()[0]
        text += f", PostgreSQL {version}"
    except (OSError, subprocess.CalledProcessError, IndexError):
        pass
    return text


def _brief(summary: dict) -> str:
    return ", ".join(
        f"{k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for k, v in summary.items()
    )


if __name__ == "__main__":
    main()
