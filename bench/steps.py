"""Where a drain's and a pickup's time goes inside our worker, step by step.

    bench/.venv/bin/python -m bench.steps drain  [--backend postgres] [--n 20000] [-- WORKER ARGS]
    bench/.venv/bin/python -m bench.steps pickup [--backend postgres] [--n 40]

Ours only, one worker process with the bench project's settings on a fresh
database. The worker runs with a few of its methods wrapped in a clock
(CLOCK_MONOTONIC, one clock for every process on the host): the wakeup's
wake, the claim loop's poll, the store's claim and group completion, and the
hand-off to a handler thread. Nothing is timed in the test suite; this is a
reading aid for docs/benchmarks.md ("Why the misses stay").

- `drain`: N queued no-op tasks, `cairnq_worker --burst`: how many claims
  and completions, of what size, how long each took (p50/p90) and how much
  of the drain they filled.
- `pickup`: N tasks enqueued one at a time 0.1-0.3 s apart to an idle
  worker, as W3 does: for each pickup (enqueue returned -> handler started),
  when the wake came, when the claim started and how long it took, and the
  hand-off; their medians over the N pickups.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_NAME = "cairnq_bench_steps"
SQLITE_PATH = "/tmp/cairnq_bench/steps.sqlite3"


def mono() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# ------------------------------------------------------------ the worker side
def run_worker(events_path: str, worker_args: list[str]) -> None:
    """Run cairnq_worker in this process with its steps clocked; write them out at exit."""
    import django

    django.setup()
    from django.core.management import call_command

    from cairnq_django.store.leases import LeaseOperations
    from cairnq_django.wakeup.base import Waits
    from cairnq_django.worker.pools import HandlerThreads
    from cairnq_django.worker.runner import Worker

    events: list[tuple[str, float, float, int]] = []

    def clocked(cls: type, name: str, step: str, size=None) -> None:
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            start = mono()
            result = original(self, *args, **kwargs)
            events.append((step, start, mono(), size(args, result) if size else 0))
            return result

        setattr(cls, name, wrapper)

    clocked(Waits, "_wake_all", "wake")
    clocked(Worker, "_poll", "poll")
    clocked(LeaseOperations, "claim", "claim", lambda args, rows: len(rows))
    clocked(LeaseOperations, "complete_encoded_many", "complete", lambda args, rows: len(rows))
    clocked(HandlerThreads, "submit", "hand-off")

    def dump() -> None:
        with open(events_path, "w") as f:
            json.dump(events, f)

    atexit.register(dump)
    call_command("cairnq_worker", *worker_args)


# ------------------------------------------------------------ the driver side
def prepare(backend: str) -> None:
    """A fresh, migrated database for this run, named in the environment."""
    os.environ.update(
        BENCH_SYSTEM="cairnq_django", BENCH_BACKEND=backend,
        DJANGO_SETTINGS_MODULE="bench.project.settings",
        PYTHONPATH=os.environ.get("PYTHONPATH", ROOT),
    )
    if backend == "postgres":
        os.environ["BENCH_DB"] = PG_NAME
        for command in (["dropdb", "--if-exists", PG_NAME], ["createdb", PG_NAME]):
            subprocess.run([*command, "-h", "127.0.0.1", "-U", os.environ.get("PGUSER", "root")], check=True)
    else:
        os.makedirs(os.path.dirname(SQLITE_PATH), exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(SQLITE_PATH + suffix):
                os.unlink(SQLITE_PATH + suffix)
        os.environ["BENCH_DB"] = SQLITE_PATH
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v", "0"], check=True, cwd=ROOT)
    import django

    django.setup()


def start_worker(events_path: str, worker_args: list[str], env: dict[str, str] | None = None):
    return subprocess.Popen(
        [sys.executable, "-m", "bench.steps", "_worker", events_path, "--", *worker_args],
        cwd=ROOT, env=dict(os.environ, **(env or {})),
    )


def read_events(path: str) -> list[tuple[str, float, float, int]]:
    with open(path) as f:
        return [tuple(e) for e in json.load(f)]


def quantiles(values: list[float]) -> str:
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    return f"p50 {statistics.median(values):.2f} ms, p90 {p90:.2f} ms"


def drain(args: argparse.Namespace) -> None:
    import cairnq_django

    cairnq_django.enqueue_many([("noop", {})] * args.n)
    events_path = f"/tmp/steps-events-{os.getpid()}.json"
    started = mono()
    worker = start_worker(events_path, ["--burst", *args.worker_args])
    if worker.wait() != 0:
        sys.exit(f"the worker exited with {worker.returncode}")
    events = read_events(events_path)
    claims = [e for e in events if e[0] == "claim" and e[3]]
    print(f"{args.backend}, {args.n} tasks, worker args {args.worker_args or '(defaults)'}: "
          f"spawn -> exit {mono() - started:.2f} s")
    span = claims[-1][2] - claims[0][1] if claims else 0.0
    print(f"from the first claim to the last: {span:.2f} s, {args.n / span:,.0f} tasks/s" if span else "")
    for step in ("claim", "complete"):
        rows = [e for e in events if e[0] == step and e[3]]
        if not rows:
            continue
        durations = [(e[2] - e[1]) * 1000 for e in rows]
        sizes = [e[3] for e in rows]
        print(f"  {step}: {len(rows)} statements, {sum(sizes)} tasks, {statistics.mean(sizes):.1f} per "
              f"statement, {quantiles(durations)}, {sum(durations) / 1000:.2f} s in all")


def pickup(args: argparse.Namespace) -> None:
    import cairnq_django

    stamp_path = f"/tmp/steps-stamps-{os.getpid()}.txt"
    open(stamp_path, "w").close()
    events_path = f"/tmp/steps-events-{os.getpid()}.json"
    worker = start_worker(events_path, ["--noreload"], env={"BENCH_STAMP": stamp_path})

    def started(seq: int, timeout: float = 30.0) -> float:
        deadline = mono() + timeout
        while mono() < deadline:
            with open(stamp_path) as f:
                for line in f:
                    s, t = line.split()
                    if int(s) == seq:
                        return float(t)
            time.sleep(0.002)
        raise RuntimeError(f"task {seq} did not start")

    try:
        cairnq_django.enqueue("noop", {"seq": -1})  # warm-up: the worker is up once it ran
        started(-1, 60.0)
        time.sleep(1.0)
        returned = []
        for seq in range(args.n):
            time.sleep(random.uniform(0.1, 0.3))
            cairnq_django.enqueue("noop", {"seq": seq})
            returned.append(mono())
            started(seq)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait()
    with open(stamp_path) as f:
        handler = {int(s): float(t) for s, t in (line.split() for line in f)}
    os.unlink(stamp_path)
    events = read_events(events_path)
    steps = ("pickup", "wake", "claim start", "claim", "hand-off end")
    parts: dict[str, list[float]] = {step: [] for step in steps}
    for seq, back in enumerate(returned):
        window = [e for e in events if back - 0.005 <= e[1] <= handler[seq]]
        claim = next((e for e in window if e[0] == "claim" and e[3]), None)
        wake = next((e for e in window if e[0] == "wake"), None)
        handed = next((e for e in window if e[0] == "hand-off"), None)
        if claim is None or handed is None:
            continue  # picked up by a poll that began before the enqueue returned
        parts["pickup"].append((handler[seq] - back) * 1000)
        if wake is not None:
            parts["wake"].append((wake[1] - back) * 1000)
        parts["claim start"].append((claim[1] - back) * 1000)
        parts["claim"].append((claim[2] - claim[1]) * 1000)
        parts["hand-off end"].append((handed[2] - back) * 1000)
    print(f"{args.backend}, {len(parts['pickup'])} of {args.n} pickups; times from the enqueue's return:")
    for name, values in parts.items():
        if values:
            label = "claim (its duration)" if name == "claim" else name
            print(f"  {label}: {quantiles(values)}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_worker":
        rest = sys.argv[3:]
        run_worker(sys.argv[2], rest[1:] if rest[:1] == ["--"] else rest)
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["drain", "pickup"])
    parser.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--n", type=int, default=None, help="tasks (drain: 20000, pickup: 40)")
    parser.add_argument("worker_args", nargs="*", help="after --: extra cairnq_worker arguments (drain)")
    args = parser.parse_args()
    if args.n is None:
        args.n = 20000 if args.mode == "drain" else 40
    prepare(args.backend)
    (drain if args.mode == "drain" else pickup)(args)


if __name__ == "__main__":
    main()
