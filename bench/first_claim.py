"""Run the example project's `cairnq_worker`, ending the process as it makes its first claim.

    cd example_project && PYTHONPATH=. DATABASE_URL=sqlite:////tmp/cairnq_startup.sqlite3 \\
        valgrind --tool=callgrind --callgrind-out-file=/tmp/first_claim.cg \\
        ../.venv/bin/python ../bench/first_claim.py cairnq_worker --burst

What the worker does from spawn to its first claim, and nothing after: the
claim itself is not made (the queued task stays queued, so runs repeat
without re-enqueueing). Under callgrind the instruction count ("Collected")
is a start-up figure that a busy machine does not move, unlike
bench/startup.py's wall-clock one; run once without valgrind first, so that
modules changed since the last run are not compiled inside the count. It
prints the process's CPU time (all threads) at that point, and the wall time
since SPAWNED if the caller sets it (epoch seconds, just before spawning).
"""

from __future__ import annotations

import os
import runpy
import sys
import time

import django

_setup = django.setup


def _setup_then_patch(*args, **kwargs) -> None:
    _setup(*args, **kwargs)
    from cairnq_django.worker import runner

    def first_claim(*args, **kwargs):
        spawned = os.environ.get("SPAWNED")
        wall = f" wall={time.time() - float(spawned):.4f}" if spawned else ""
        sys.stderr.write(f"first claim: cpu={time.process_time():.4f}{wall}\n")
        sys.stderr.flush()
        os._exit(0)

    runner.Worker._claim = first_claim


django.setup = _setup_then_patch
sys.argv = ["manage.py", *sys.argv[1:]]
runpy.run_path("manage.py", run_name="__main__")
