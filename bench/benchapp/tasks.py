"""No-op handlers for the system under test (autodiscovered as <app>/tasks.py)."""

import os

from django.conf import settings

from .stamp import stamp

if settings.SYSTEM == "cairnq_django":
    from cairnq_django import task

    @task("noop")
    def noop(ctx, payload):
        stamp(payload.get("seq"))

elif settings.SYSTEM == "django_tasks_db":
    from .dt_tasks import noop  # noqa: F401

elif settings.SYSTEM == "procrastinate":
    from .procrastinate_tasks import noop  # noqa: F401

if settings.SYSTEM == "cairnq_django":
    import time as _time

    @task("hop")
    def hop(ctx, payload):
        """bench/workflow_hop.py: the handler's start on this host's wall clock, in ms."""
        path = os.environ.get("BENCH_HOP_STAMP")
        if path:
            with open(path, "a") as f:
                f.write(f"{ctx.task_id} {_time.time() * 1000:.3f}\n")
