"""Django's Tasks framework from wherever this Django has it, and the admin's markup.

Django 6.0+ ships it as `django.tasks`; on Django 5.2 the `django-tasks`
backport provides the same API as `django_tasks` (install
`cairnq-django[tasks]`). This is the only module that knows which one is in
use; everything else imports the framework's names from here.

`AVAILABLE` is False when neither is importable; the other names are then
absent, and importing `cairnq_django.backends` raises ImportError.
"""

from __future__ import annotations

from dataclasses import fields

import django

SOURCE: str | None  # which module provides the framework, None when neither does

try:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_QUEUE_NAME,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
except ImportError:
    try:
        # django-stubs 6 types django.tasks, so mypy reads every name below
        # as its django.tasks twin; the backport's own types differ only in
        # name, hence the ignores.
        from django_tasks import (  # type: ignore[assignment, no-redef]
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task,
            task_backends,
        )

        # The backport registers its system check from its app's ready();
        # registering it here runs it without the app too (once either way).
        from django_tasks import checks as _checks  # noqa: F401
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[assignment]
        from django_tasks.base import (  # type: ignore[assignment]
            DEFAULT_TASK_QUEUE_NAME,
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskError,
        )
        from django_tasks.exceptions import (  # type: ignore[assignment]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[assignment]
            TaskResultDoesNotExist,
            TaskResultMismatch,
        )
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        SOURCE = "django_tasks"
    except ImportError:
        SOURCE = None

AVAILABLE = SOURCE is not None

# Django's main branch is adding task metadata (TaskResult.metadata, with
# `_`-prefixed keys reserved for backends); the backend fills it where it exists.
HAS_METADATA = AVAILABLE and "metadata" in {f.name for f in fields(TaskResult)}

# Django 6.1's admin marks breadcrumbs up as <ol class="breadcrumbs"><li>...</li></ol> and
# styles only that; 5.2 and 6.0 use <div class="breadcrumbs"> with &rsaquo; between links.
# The admin's own pages render theirs through the cq_breadcrumbs tag, which reads this.
ADMIN_BREADCRUMBS_AS_LIST = django.VERSION >= (6, 1)

__all__ = [
    "ADMIN_BREADCRUMBS_AS_LIST",
    "AVAILABLE",
    "BaseTaskBackend",
    "DEFAULT_TASK_QUEUE_NAME",
    "HAS_METADATA",
    "InvalidTask",
    "SOURCE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
