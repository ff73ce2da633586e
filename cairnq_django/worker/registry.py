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

from .. import declared
from ..conf import tasks_setting_in_use
from ..validators import check_int32

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
    priority: int | None = None
    #: Only these exceptions retry (None: every one does); a TaskError keeps its own say.
    autoretry_for: tuple[type[BaseException], ...] | None = None
    #: This handler's backoff (first window, cap) in ms; None: the worker's settings.
    retry_backoff_ms: tuple[int, int] | None = None

    def retries(self, exc: BaseException) -> bool:
        """Whether a plain exception `exc` raised by this handler may be retried."""
        return self.autoretry_for is None or isinstance(exc, self.autoretry_for)

    @property
    def draws_alone(self) -> bool:
        """Whether this name claims from its own quota instead of the shared one."""
        return self.batch is not None or self.concurrency is not None


@dataclass
class Registry:
    """A name -> Registration map; the process-wide one is `registry`."""

    handlers: dict[str, Registration] = field(default_factory=dict)
    # Only the process-wide registry's handlers declare what an enqueue by
    # name takes (declared.py); a private one (a test's, a worker's own) does not.
    declares: bool = False

    def register(
        self,
        name: str,
        fn: Handler,
        *,
        batch: int | None = None,
        concurrency: int | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        priority: int | None = None,
        autoretry_for: Any = None,
        retry_backoff: Any = None,
        retry_backoff_max: Any = None,
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
        if priority is not None:
            check_int32(f"priority for task {name!r}", priority)
        retry_on = _exception_types(name, autoretry_for)
        backoff = _backoff_ms(name, retry_backoff, retry_backoff_max)
        existing = self.handlers.get(name)
        if existing is not None and _identity(existing.fn) != _identity(fn):
            raise ValueError(
                f"Task {name!r} is already registered to {_identity(existing.fn)}; "
                f"refusing to register {_identity(fn)} under the same name."
            )
        registration = Registration(
            name=name, fn=fn, is_async=_is_async(fn), batch=batch,
            concurrency=concurrency, max_attempts=max_attempts, queue=queue, priority=priority,
            autoretry_for=retry_on, retry_backoff_ms=backoff,
        )
        self.handlers[name] = registration
        if self.declares:
            declared.declare(name, queue=queue, max_attempts=max_attempts, priority=priority)
        return registration

    def unregister(self, name: str) -> None:
        """Forget a task name (tests use this to keep the registry clean)."""
        self.handlers.pop(name, None)
        if self.declares:
            declared.forget(name)

    def get(self, name: str) -> Registration | None:
        return self.handlers.get(name)

    def names(self) -> list[str]:
        return sorted(self.handlers)

    def __contains__(self, name: object) -> bool:
        return name in self.handlers

    def __len__(self) -> int:
        return len(self.handlers)


registry = Registry(declares=True)


# Celery's own default for retry_backoff_max: ten minutes.
_BACKOFF_MAX_S = 600


def _exception_types(name: str, value: Any) -> tuple[type[BaseException], ...] | None:
    if value is None:
        return None
    types = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not types or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise TypeError(
            f"autoretry_for for task {name!r} must be an exception class or a tuple of them, "
            f"got {value!r}."
        )
    return types


def _seconds(name: str, option: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{option} for task {name!r} must be a number of seconds >= 0, got {value!r}.")
    return float(value)


def _backoff_ms(name: str, backoff: Any, backoff_max: Any) -> tuple[int, int] | None:
    """(first window, cap) in ms from Celery's retry_backoff / retry_backoff_max, or None."""
    if backoff is None:
        if backoff_max is not None:
            raise ValueError(f"retry_backoff_max for task {name!r} needs retry_backoff as well.")
        return None
    # As in Celery: True starts at one second; False retries at once.
    first = 1.0 if backoff is True else 0.0 if backoff is False else _seconds(
        name, "retry_backoff", backoff
    )
    cap = _BACKOFF_MAX_S if backoff_max is None else _seconds(
        name, "retry_backoff_max", backoff_max
    )
    return int(first * 1000), int(cap * 1000)


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


#: Register `fn` as the handler for task `name` in the process-wide registry.
register = registry.register


def task(
    name: str | Handler | None = None,
    *,
    batch: int | None = None,
    concurrency: int | None = None,
    max_attempts: int | None = None,
    queue: str | None = None,
    priority: int | None = None,
    autoretry_for: Any = None,
    retry_backoff: Any = None,
    retry_backoff_max: Any = None,
) -> Any:
    """Register a handler: `@task` (named after the function) or `@task("app.name", ...)`.

    The decorated function is returned unchanged apart from `enqueue()` and
    `aenqueue()` helpers that submit it by name. Its queue, max_attempts and
    priority hold for every enqueue by name in a process that registered it
    (declared.py); an enqueue's own arguments win. `autoretry_for`,
    `retry_backoff` and `retry_backoff_max` mean what they mean in Celery, for
    the worker that runs this handler (docs/from-celery.md).
    """

    def decorate(fn: Handler) -> Handler:
        task_name = name if isinstance(name, str) else getattr(fn, "__name__", "")
        if not task_name or task_name == "<lambda>":
            raise ValueError(f"Cannot derive a task name from {fn!r}; pass one explicitly.")
        registration = register(
            task_name, fn, batch=batch, concurrency=concurrency,
            max_attempts=max_attempts, queue=queue, priority=priority,
            autoretry_for=autoretry_for, retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
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
    if not tasks_setting_in_use():
        return
    from .. import compat

    if compat.AVAILABLE:
        from ..backends.handlers import register_framework_tasks

        register_framework_tasks(registry)
