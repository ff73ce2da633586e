"""No-op handlers for the system under test (autodiscovered as <app>/tasks.py)."""

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
