"""Record when a handler starts, for the pickup-latency workload (W3).

The handlers are no-ops except for this: with BENCH_STAMP set they append
"<seq> <CLOCK_MONOTONIC seconds>" to that file. CLOCK_MONOTONIC is one clock
for every process on the host, so the enqueueing process can subtract.
"""

import os
import time

_path = os.environ.get("BENCH_STAMP")
_fd = os.open(_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if _path else None


def stamp(seq) -> None:
    """Append this handler's start time when the pickup workload asked for it."""
    if _fd is not None and seq is not None:
        os.write(_fd, f"{seq} {time.clock_gettime(time.CLOCK_MONOTONIC)}\n".encode())
