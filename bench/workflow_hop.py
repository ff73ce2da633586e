"""Workflow hop latency and a 10,000 -> 1 fan-in, beside a plain task's pickup.

    BENCH_BACKEND=sqlite   python bench/workflow_hop.py [--hops 50] [--fan-in 10000]
    BENCH_BACKEND=postgres BENCH_DB=bench_wf python bench/workflow_hop.py

Creates a fresh database (SQLite file, or the named Postgres database),
starts one idle `cairnq_worker`, then:

- pickup: a plain task enqueued every 300 ms; its handler's start minus the
  row's created_at_ms.
- hop: a two-step workflow a -> b every 300 ms; b's handler start minus a's
  completed_at_ms (the commit that released b), and the part of it spent in
  the release (b's created_at_ms minus a's completed_at_ms, in that commit);
  b's own pickup (its handler start minus its created_at_ms), which bounds
  the time from a's commit to b's start, beside the plain pickup.
- fan-in: 10,000 parents and one child, enqueued, then every parent claimed
  and completed in this process through the worker's step settle
  (StepSettling), each completion timed; the last one is the completion that
  releases the child. Then the child's ctx.parents read, timed.

Times are this host's wall clock against the row's (the database's clock on
PostgreSQL, on the same host): millisecond resolution. Figures from a shared
machine must be labelled "loaded box".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.project.settings")
os.environ.setdefault("BENCH_SYSTEM", "cairnq_django")


def _fresh_database() -> None:
    backend = os.environ.get("BENCH_BACKEND", "sqlite")
    if backend == "postgres":
        name = os.environ.setdefault("BENCH_DB", "bench_workflow_hop")
        subprocess.run(["dropdb", "--if-exists", "-h", "127.0.0.1", name], check=True)
        subprocess.run(["createdb", "-h", "127.0.0.1", name], check=True)
    else:
        path = os.environ.setdefault("BENCH_DB", "/tmp/cairnq_workflow_hop.sqlite3")
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _stamps(path: str) -> dict[str, float]:
    text = Path(path).read_text() if Path(path).exists() else ""
    return {task_id: float(ms) for task_id, ms in (line.split() for line in text.splitlines())}


def _wait(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("Timed out waiting for the worker.")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", type=int, default=50)
    parser.add_argument("--fan-in", type=int, default=10_000)
    args = parser.parse_args()
    _fresh_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import cairnq_django
    from cairnq_django.models import Task
    from cairnq_django.store.leases import get_leases
    from cairnq_django.workflows.reads import parent_results
    from cairnq_django.workflows.settling import StepSettling

    stamp = tempfile.NamedTemporaryFile(prefix="hop-", delete=False).name
    env = {**os.environ, "BENCH_HOP_STAMP": stamp, "PYTHONPATH": str(ROOT)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "cairnq_worker", "--concurrency", "4", "--names", "hop"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)  # started and idle
        pickups, hops, releases, child_pickups = [], [], [], []
        for _ in range(args.hops):
            task = cairnq_django.enqueue("hop", {})
            _wait(lambda t=task: t.id in _stamps(stamp))
            created = Task.objects.get(pk=task.id).created_at_ms
            pickups.append(_stamps(stamp)[task.id] - created)
            time.sleep(0.3)
        for _ in range(args.hops):
            wf = cairnq_django.Workflow("hop")
            a = wf.add("a", "hop")
            wf.add("b", "hop", after=a)
            run = wf.enqueue()
            _wait(lambda r=run: cairnq_django.get_workflow(r.id).state == "succeeded")
            run = cairnq_django.get_workflow(run.id)
            parent_done = Task.objects.get(pk=run.step("a").task_id).completed_at_ms
            child_created = Task.objects.get(pk=run.step("b").task_id).created_at_ms
            child_start = _stamps(stamp)[run.step("b").task_id]
            hops.append(child_start - parent_done)
            releases.append(child_created - parent_done)
            child_pickups.append(child_start - child_created)
            time.sleep(0.3)
    finally:
        worker.terminate()
        worker.wait(60)
    backend = os.environ.get("BENCH_BACKEND", "sqlite")
    print(f"[{backend}, loaded box] plain pickup  p50 {_pct(pickups, .5):.1f} ms"
          f"  p95 {_pct(pickups, .95):.1f} ms  (n={len(pickups)})")
    print(f"[{backend}, loaded box] workflow hop  p50 {_pct(hops, .5):.1f} ms  p95 {_pct(hops, .95):.1f} ms"
          f"  (parent completed_at -> child handler start, n={len(hops)}); of which the release "
          f"(parent completed_at -> child created_at) p50 {_pct(releases, .5):.1f} ms")
    # The child's row is inserted just before its parent's commit, so created_at -> start bounds
    # the time from the parent's commit to the child's start: compare it with a plain pickup.
    print(f"[{backend}, loaded box] child pickup  p50 {_pct(child_pickups, .5):.1f} ms"
          f"  p95 {_pct(child_pickups, .95):.1f} ms  (child created_at -> child handler start)")

    # The fan-in, settled in this process so each completion can be timed.
    store = get_leases()
    wf = cairnq_django.Workflow("fan-in")
    parents = wf.map("p", "hop", [{}] * args.fan_in)
    wf.add("sink", "hop", after=parents)
    started = time.perf_counter()
    run = wf.enqueue()
    enqueue_s = time.perf_counter() - started
    settle_ms = []
    settling = StepSettling(store)
    while True:
        claimed = store.claim(queues=["default"], worker_id="bench", limit=500, names=["hop"])
        parents_claimed = [t for t in claimed if t.metadata["cairnq_workflow"]["name"] != "sink"]
        if not parents_claimed:
            break
        for task in parents_claimed:
            t0 = time.perf_counter()
            settling.complete(task.id, "bench", {"n": 1})
            settle_ms.append((time.perf_counter() - t0) * 1000)
    sink = cairnq_django.get_workflow(run.id).step("sink")
    if sink.state not in ("queued", "running"):  # the last claim may have taken it
        raise SystemExit(f"The fan-in step was not released: {sink}")
    step_id = Task.objects.get(pk=sink.task_id).metadata["cairnq_workflow"]["step"]
    t0 = time.perf_counter()
    results = parent_results(step_id, using=store.using)["p"]
    read_ms = (time.perf_counter() - t0) * 1000
    if len(results) != args.fan_in:
        raise SystemExit(f"ctx.parents held {len(results)} results, not {args.fan_in}.")
    print(f"[{backend}, loaded box] fan-in {args.fan_in} -> 1: enqueue {enqueue_s:.2f} s; parent completion "
          f"p50 {statistics.median(settle_ms):.2f} ms, p95 {_pct(settle_ms, .95):.2f} ms, "
          f"the last (releases the child) {settle_ms[-1]:.2f} ms; all parents {sum(settle_ms) / 1000:.1f} s; "
          f"ctx.parents read {read_ms:.0f} ms")


if __name__ == "__main__":
    main()
