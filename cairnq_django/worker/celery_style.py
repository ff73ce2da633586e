"""Celery's calling idioms on `@task` handlers: `delay(**kwargs)` and `apply_async(...)`.

Only the parts that map onto an enqueue one-to-one (docs/from-celery.md): a CairnQ task's
payload is one JSON value, so keyword arguments become a dict payload, and the handler
receives them as `(ctx, payload)`. What has no equivalent raises TypeError naming the
alternative, rather than being accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

EXPIRES_UNSUPPORTED = (
    "apply_async(expires=...) has no CairnQ equivalent: the protocol's tasks do not expire. "
    "Put the deadline in the payload and return early from the handler once it has passed "
    "(docs/from-celery.md)."
)
ARGS_UNSUPPORTED = (
    "apply_async(args=...) with positional arguments has no CairnQ equivalent: a task's payload "
    "is one JSON value. Pass kwargs={...}; the handler receives them as its payload dict."
)


def attach(fn: Any, enqueue: Callable[..., Any]) -> None:
    """Give a registered handler `delay` and `apply_async`, both going through `enqueue`."""

    def delay(**kwargs: Any) -> Any:
        """Enqueue with these keyword arguments as the payload (Celery's task.delay)."""
        return enqueue(kwargs)

    def apply_async(
        args: tuple[Any, ...] | list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        countdown: float | timedelta | None = None,
        eta: datetime | None = None,
        expires: Any = None,
        queue: str | None = None,
        priority: int | None = None,
        **options: Any,
    ) -> Any:
        """Enqueue with Celery's options; other keywords go to enqueue() (key=, max_attempts=)."""
        if args:
            raise TypeError(ARGS_UNSUPPORTED)
        if expires is not None:
            raise TypeError(EXPIRES_UNSUPPORTED)
        if countdown is not None and eta is not None:
            raise TypeError("Pass countdown or eta to apply_async, not both.")
        # Celery's scheduling options as enqueue()'s keywords; they win over `options`.
        translated: dict[str, Any] = {}
        if countdown is not None:
            if isinstance(countdown, bool) or not isinstance(countdown, int | float | timedelta):
                raise TypeError(f"countdown must be seconds or a timedelta, got {countdown!r}.")
            if not isinstance(countdown, timedelta):
                countdown = timedelta(seconds=countdown)
            translated["delay"] = countdown
        if eta is not None:
            translated["run_at"] = eta
        if queue is not None:
            translated["queue"] = queue
        if priority is not None:
            translated["priority"] = priority
        return enqueue(kwargs or {}, **{**options, **translated})

    fn.delay = delay
    fn.apply_async = apply_async
