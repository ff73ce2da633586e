"""Which task names this process can run, and the handler behind each.

Handlers live in `<app>/tasks.py` and register themselves with `@task` when
the module is imported; `autodiscover()` imports those modules at worker start,
the way the admin discovers `admin.py`. A task row only ever names a handler:
nothing read from the database is imported or evaluated.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import autodiscover_modules

if TYPE_CHECKING:
    from ..client import PendingTask
    from ..records import TaskRecord

Handler = Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """One registered task name and how it is delivered."""

    name: str
    fn: Handler
    is_async: bool
    batch: int | None = None
    concurrency: int | None = None
    max_attempts: int | None = None
    queue: str | None = None

    @property
    def draws_alone(self) -> bool:
        """Whether this name claims from its own quota instead of the shared one."""
        return self.batch is not None or self.concurrency is not None


@dataclass
class Registry:
    """A name -> Registration map; the process-wide one is `registry`."""

    handlers: dict[str, Registration] = field(default_factory=dict)

    def register(
        self,
        name: str,
        fn: Handler,
        *,
        batch: int | None = None,
        concurrency: int | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
    ) -> Registration:
        """Register `fn` as the handler of task `name` and return its registration."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"A task name must be a non-empty string, got {name!r}.")
        if not callable(fn):
            raise TypeError(f"The handler for task {name!r} must be callable, got {fn!r}.")
        for option, value in (
            ("batch", batch), ("concurrency", concurrency), ("max_attempts", max_attempts),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"{option} for task {name!r} must be an integer >= 1, got {value!r}.")
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ValueError(f"queue for task {name!r} must be a non-empty string, got {queue!r}.")
        existing = self.handlers.get(name)
        if existing is not None and _identity(existing.fn) != _identity(fn):
            raise ValueError(
                f"Task {name!r} is already registered to {_identity(existing.fn)}; "
                f"refusing to register {_identity(fn)} under the same name."
            )
        registration = Registration(
            name=name, fn=fn, is_async=_is_async(fn), batch=batch,
            concurrency=concurrency, max_attempts=max_attempts, queue=queue,
        )
        self.handlers[name] = registration
        return registration

    def unregister(self, name: str) -> None:
        """Forget a task name (tests use this to keep the registry clean)."""
        self.handlers.pop(name, None)

    def get(self, name: str) -> Registration | None:
        return self.handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self.handlers)

    def __contains__(self, name: object) -> bool:
        return name in self.handlers

    def __len__(self) -> int:
        return len(self.handlers)


registry = Registry()


def _identity(fn: Handler) -> str:
    # Compare by qualified name, not object identity: autoreload and a module
    # imported under two names both re-run the decorator with a new object.
    module = getattr(fn, "__module__", "?")
    qualname = getattr(fn, "__qualname__", repr(fn))
    return f"{module}.{qualname}"


def _is_async(fn: Handler) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, to ask if it is async
    return call is not None and inspect.iscoroutinefunction(call)


def register(
    name: str,
    fn: Handler,
    *,
    batch: int | None = None,
    concurrency: int | None = None,
    max_attempts: int | None = None,
    queue: str | None = None,
) -> Registration:
    """Register `fn` as the handler for task `name` in the process-wide registry."""
    return registry.register(
        name, fn, batch=batch, concurrency=concurrency, max_attempts=max_attempts, queue=queue
    )


def task(
    name: str | Handler | None = None,
    *,
    batch: int | None = None,
    concurrency: int | None = None,
    max_attempts: int | None = None,
    queue: str | None = None,
) -> Any:
    """Register a handler: `@task` (named after the function) or `@task("app.name", ...)`.

    The decorated function is returned unchanged apart from `enqueue()` and
    `aenqueue()` helpers that submit it by name with the registered queue and
    max_attempts as defaults.
    """

    def decorate(fn: Handler) -> Handler:
        task_name = name if isinstance(name, str) else getattr(fn, "__name__", "")
        if not task_name or task_name == "<lambda>":
            raise ValueError(f"Cannot derive a task name from {fn!r}; pass one explicitly.")
        registration = register(
            task_name, fn, batch=batch, concurrency=concurrency,
            max_attempts=max_attempts, queue=queue,
        )
        _attach_enqueue(fn, registration)
        return fn

    if callable(name):
        return decorate(name)
    return decorate


def _attach_enqueue(fn: Handler, registration: Registration) -> None:
    defaults: dict[str, Any] = {}
    if registration.queue is not None:
        defaults["queue"] = registration.queue
    if registration.max_attempts is not None:
        defaults["max_attempts"] = registration.max_attempts

    def enqueue(payload: Any = None, **options: Any) -> TaskRecord | PendingTask:
        """Enqueue this task by its registered name."""
        from ..client import enqueue as client_enqueue

        return client_enqueue(registration.name, payload, **{**defaults, **options})

    async def aenqueue(payload: Any = None, **options: Any) -> TaskRecord | PendingTask:
        """Enqueue this task by its registered name (async)."""
        from ..client import aenqueue as client_aenqueue

        return await client_aenqueue(registration.name, payload, **{**defaults, **options})

    try:
        fn.task_name = registration.name  # type: ignore[attr-defined]
        fn.enqueue = enqueue  # type: ignore[attr-defined]
        fn.aenqueue = aenqueue  # type: ignore[attr-defined]
        # Celery's delay(**kwargs) and apply_async(kwargs=, countdown=, ...), through enqueue.
        from .celery_style import attach as attach_celery_style

        attach_celery_style(fn, enqueue)
    except (AttributeError, TypeError):
        pass  # a callable that refuses attributes is still a fine handler


def autodiscover() -> None:
    """Import every installed app's `tasks` module so its handlers register.

    Framework tasks (`django.tasks`) built there, or in the modules a CairnQ
    backend lists in OPTIONS["MODULES"], are registered under their row names.
    """
    autodiscover_modules("tasks")
    from .. import compat

    if compat.AVAILABLE:
        from ..backends.handlers import register_framework_tasks

        register_framework_tasks(registry)
