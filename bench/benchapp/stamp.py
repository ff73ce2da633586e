"""Record when a handler starts and when it finished, for the workloads that read them.

The handlers are no-ops except for this. With BENCH_STAMP set they append
"<seq> <CLOCK_MONOTONIC seconds>" to that file (pickup latency, W3; lateness,
W6): CLOCK_MONOTONIC is one clock for every process on the host, so the
enqueueing process can subtract. With BENCH_DONE set they append the wall-clock
time they finished: the drain's progress for the peers that keep no durable
row of a finished task (Celery without a result backend, PgQueuer, Huey,
django-q2), read by the harness like the other systems' tables.
"""

import os
import time

_path = os.environ.get("BENCH_STAMP")
_fd = os.open(_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if _path else None
_done_path = os.environ.get("BENCH_DONE")
_done_fd = os.open(_done_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if _done_path else None


def stamp(seq) -> None:
    """Append this handler's start time when the pickup workload asked for it."""
    if _fd is not None and seq is not None:
        os.write(_fd, f"{seq} {time.clock_gettime(time.CLOCK_MONOTONIC)}\n".encode())


def finished() -> None:
    """Append this handler's end time when the drain reads progress from a file."""
    if _done_fd is not None:
        os.write(_done_fd, f"{time.time()}\n".encode())
