"""A backend for Django's Tasks framework (`django.tasks`, or the `django-tasks` backport).

    TASKS = {"default": {"BACKEND": "cairnq_django.backends.CairnQBackend"}}

See docs/tasks-framework.md.
"""

from .. import compat

if not compat.AVAILABLE:
    raise ImportError(
        "cairnq_django.backends needs Django's Tasks framework: Django 6.0 or later, or "
        "on Django 5.2 the django-tasks backport (pip install 'cairnq-django[tasks]')."
    )

from . import handlers as _handlers  # noqa: E402,F401  (connects the task_finished bridge)
from .backend import CairnQBackend  # noqa: E402
from .definitions import CairnQTask  # noqa: E402
from .waiting import await_result, wait_for_result  # noqa: E402

__all__ = ["CairnQBackend", "CairnQTask", "await_result", "wait_for_result"]
