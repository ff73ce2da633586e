"""CairnQBackend: Django's Tasks framework on the CairnQ tables.

    TASKS = {
        "default": {
            "BACKEND": "cairnq_django.backends.CairnQBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3},
        }
    }

`enqueue` writes a row through `cairnq_django.enqueue`, so it joins the
caller's transaction on the queue's database; `cairnq_worker` runs it.
"""

from __future__ import annotations

from functools import partial
from importlib import import_module
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, transaction

from .. import client, compat
from ..conf import cairnq_settings
from ..errors import SerializationError
from ..records import DEFAULT_CONFLICT
from ..validators import is_integer
from .definitions import CairnQTask, remember, row_name, validate_extras
from .discovery import find_task
from .results import pending_result, split_payload, to_result
from .values import arguments_problem, json_arguments

OPTION_DEFAULTS: dict[str, Any] = {
    # Alias of the database holding the CairnQ tables (default: CAIRNQ["DATABASE"]).
    "DATABASE": None,
    # Attempts of a task that raises before it fails for good. The framework's
    # own backends run a task once; raise it to retry with backoff.
    "MAX_ATTEMPTS": 1,
    # Modules holding @task functions beyond installed apps' tasks modules.
    "MODULES": [],
    # Write rows when the caller's transaction on `default` commits (for a
    # queue in another database); None follows CAIRNQ["ENQUEUE_ON_COMMIT"].
    "ON_COMMIT": None,
}


class CairnQBackend(compat.BaseTaskBackend):
    """Enqueue framework tasks as CairnQ rows; `cairnq_worker` runs them.

    aenqueue() and aget_result() are the base class's: enqueue() and
    get_result() run through sync_to_async (thread-sensitive).
    """

    task_class = CairnQTask

    # Does the backend support Tasks to be enqueued with the run_after attribute?
    supports_defer = True
    # Does the backend support coroutines to be enqueued?
    supports_async_task = True
    # Does the backend support results being retrieved (from any thread/process)?
    supports_get_result = True
    # Does the backend support executing Tasks in a given priority order?
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.unknown_options = sorted(set(self.options) - set(OPTION_DEFAULTS))
        merged = {**OPTION_DEFAULTS, **self.options}
        self._database = merged["DATABASE"]
        self.max_attempts = merged["MAX_ATTEMPTS"]
        self.modules: list[str] = list(merged["MODULES"])
        self.on_commit = merged["ON_COMMIT"]

    @property
    def database(self) -> str:
        """Alias of the database holding the CairnQ tables."""
        # Read on use, like every CAIRNQ setting, so override_settings applies.
        return self._database or cairnq_settings.DATABASE

    # ------------------------------------------------------------ validation
    def validate_task(self, task: Any) -> None:
        """Refuse a Task this backend cannot run; remember one it can."""
        super().validate_task(task)
        validate_extras(task)
        remember(task)

    # ------------------------------------------------------------ enqueue
    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Queue up the Task to be executed."""
        self.validate_task(task)
        args, kwargs = json_arguments(task, args, kwargs)
        try:
            written = client.enqueue(
                row_name(task),
                {"args": args, "kwargs": kwargs},
                queue=task.queue_name,
                # Both run higher numbers first: the framework's -100..100 is
                # stored as is, which keeps the order for every implementation.
                priority=task.priority,
                run_at=task.run_after,
                max_attempts=getattr(task, "max_attempts", None) or self.max_attempts,
                key=getattr(task, "key", None),
                conflict=getattr(task, "conflict", DEFAULT_CONFLICT),
                concurrency_key=getattr(task, "concurrency_key", None),
                using=self.database,
                on_commit=self.on_commit,
            )
        except SerializationError as exc:
            # What the framework lets through but the queue cannot store (NaN).
            problem = arguments_problem(task, args, kwargs)
            if problem is None:
                raise
            raise SerializationError(problem) from exc
        if isinstance(written, client.PendingTask):
            # task_enqueued (and the framework's "enqueued" log line) must
            # describe a row that exists: sent once the write after the
            # caller's commit is done, never for a rolled-back enqueue. The
            # write is the callback registered just before this one, and
            # on_commit callbacks run in order.
            transaction.on_commit(
                partial(self._announce_written, task, written), using=DEFAULT_DB_ALIAS
            )
            return pending_result(task, written.id, args, kwargs, self.alias)
        result = to_result(task, written, self.alias)
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    def _announce_written(self, task: Any, pending: client.PendingTask) -> None:
        if pending.task is not None:
            result = to_result(task, pending.task, self.alias)
            compat.task_enqueued.send(type(self), task_result=result)

    # ------------------------------------------------------------ results
    def get_result(self, result_id: str) -> Any:
        """Retrieve a task result by id; raise TaskResultDoesNotExist if there is none."""
        record = client.get(result_id, using=self.database) if isinstance(result_id, str) else None
        task = self.task_for(record.name) if record is not None else None
        if record is None or task is None or split_payload(record.payload) is None:
            raise compat.TaskResultDoesNotExist(
                f"No task result with id {result_id!r} on task backend {self.alias!r}."
            )
        return to_result(task, record, self.alias)

    def task_for(self, name: str) -> Any:
        """The Task of this backend that rows named `name` run, or None (see find_task)."""
        task = find_task(name)
        if task is None:
            return None
        # A row is ours to read whichever alias sent it: the definition names
        # the backend its decorator chose, and `.using(backend=...)` may have
        # sent it through this one (two aliases over one database, say).
        return task if task.backend == self.alias else task.using(backend=self.alias)

    # ------------------------------------------------------------ checks
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Report a missing app and OPTIONS this backend cannot use."""
        errors: list[checks.CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("cairnq_django"):
            # Without the app there are no models, so no tables to migrate:
            # the first enqueue would fail.
            errors.append(
                checks.Error(
                    f"{where} uses CairnQBackend, but 'cairnq_django' is not in "
                    "INSTALLED_APPS.",
                    hint="Add 'cairnq_django' to INSTALLED_APPS, then run "
                    "`manage.py migrate cairnq_django`.",
                    id="cairnq.E105",
                )
            )
        if self.unknown_options:
            errors.append(
                checks.Error(
                    f"{where}['OPTIONS'] has unknown keys: {', '.join(self.unknown_options)}.",
                    hint=f"CairnQBackend takes {', '.join(sorted(OPTION_DEFAULTS))}.",
                    id="cairnq.E101",
                )
            )
        if self.database not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"{where} uses database {self.database!r}, which is not in DATABASES.",
                    id="cairnq.E102",
                )
            )
        if not is_integer(self.max_attempts):
            errors.append(
                checks.Error(
                    f"{where}['OPTIONS']['MAX_ATTEMPTS'] must be an integer >= 1, "
                    f"got {self.max_attempts!r}.",
                    id="cairnq.E103",
                )
            )
        for module in self.modules:
            try:
                import_module(module)
            except ImportError as exc:
                errors.append(
                    checks.Error(
                        f"{where}['OPTIONS']['MODULES'] lists {module!r}, which cannot be "
                        f"imported: {exc}",
                        id="cairnq.E104",
                    )
                )
        return errors
