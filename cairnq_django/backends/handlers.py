"""How `cairnq_worker` runs framework tasks.

`register_framework_tasks()` registers each framework task that discovery
(discovery.py) finds, built against a CairnQ backend, as a handler under its
row name (the module path, or its `cairnq_name`). The handler reads
`{"args": [...], "kwargs": {...}}` from the payload, records the attempt on the
row, sends the framework's `task_started`, and calls the function; the
framework's `task_finished` follows the worker's own end-of-task signals. A
function that raises cairnq_django.Snooze is snoozed, not failed (the
framework's context has no snooze method; raising is the way), and no
`task_finished` is sent for it, as for a retry.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from functools import partial
from inspect import iscoroutinefunction
from typing import Any

from .. import compat, signals
from ..errors import LostLease, Snooze, TaskError
from .backend import CairnQBackend
from .definitions import known_tasks, row_name
from .discovery import import_task_modules
from .results import failure_envelope, split_payload, to_result, with_attempt
from .values import json_return_value

logger = logging.getLogger("cairnq_django.worker")


def register_framework_tasks(registry: Any) -> list[str]:
    """Register the framework tasks of the discovered modules in `registry`; return their names.

    Only tasks bound in those modules count, and only those a CairnQ backend
    validated (so `known_tasks` has them).
    """
    names = []
    for module in import_task_modules():
        for value in list(vars(module).values()):
            if not isinstance(value, compat.Task):
                continue
            name = row_name(value)
            task = known_tasks.get(name)
            if task is None or task.module_path != value.module_path or name in names:
                continue
            handler_class = AsyncTaskHandler if iscoroutinefunction(task.func) else TaskHandler
            registry.register(
                name, handler_class(task), queue=task.queue_name, priority=task.priority,
                max_attempts=getattr(task, "max_attempts", None),
            )
            names.append(name)
    return names


class TaskHandler:
    """The CairnQ handler of one framework task: `handler(ctx, payload)`."""

    def __init__(self, task: Any) -> None:
        self.task = task
        # The registry tells handlers apart by module and qualified name.
        self.__module__ = task.func.__module__
        self.__qualname__ = task.func.__qualname__

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.task.module_path}>"

    def __call__(self, ctx: Any, payload: Any) -> Any:
        args, kwargs = self.arguments(payload)
        result = self.start(ctx)
        try:
            value = self.task.call(*self.with_context(result, args), **kwargs)
        except Snooze:
            raise  # not a failure: the worker snoozes the task
        except BaseException as exc:
            # SystemExit, KeyboardInterrupt and the like too: the framework's
            # backends record them as the task's error. The worker's own
            # signals never arrive here: they go to its main thread.
            self.failed(ctx, exc)
            raise
        try:
            return json_return_value(self.task, value)
        except (TypeError, ValueError) as exc:
            self.failed(ctx, exc, returned=True)
            raise

    # ------------------------------------------------------------ steps
    def arguments(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        split = split_payload(payload)
        if split is None:
            raise TaskError(
                "invalid_payload",
                f"The payload of framework task {self.task.module_path} must be "
                '{"args": [...], "kwargs": {...}}.',
                retryable=False,
            )
        return split

    def with_context(self, result: Any, args: list[Any]) -> list[Any]:
        """The positional arguments, after the framework's TaskContext if the task takes it."""
        return [compat.TaskContext(task_result=result), *args] if self.task.takes_context else args

    def start(self, ctx: Any) -> Any:
        """Record this attempt on the row, then send task_started; return the TaskResult."""
        metadata = with_attempt(ctx.record)
        ctx.replace_metadata(metadata)  # raises LostLease unless the lease is still held
        result = to_result(self.task, replace(ctx.record, metadata=metadata), self.task.backend)
        _send(compat.task_started, self.task, task_result=result)
        return result

    def failed(self, ctx: Any, exc: BaseException, *, returned: bool = False) -> None:
        """Fail the attempt with an envelope that keeps the exception's class and traceback.

        `returned`: the function returned a value that is not JSON, which no
        retry changes.
        """
        envelope, retryable = failure_envelope(exc, ctx.record, unserializable_result=returned)
        try:
            ctx.fail(envelope, retryable=retryable)
        except LostLease:
            pass  # the worker logs the lost lease when the call ends


class AsyncTaskHandler(TaskHandler):
    """The handler of a framework task whose function is a coroutine."""

    async def __call__(self, ctx: Any, payload: Any) -> Any:
        args, kwargs = self.arguments(payload)
        # Database work of an async handler runs where ctx runs its own (ctx.run_db).
        result = await ctx.run_db(partial(self.start, ctx))
        try:
            value = await self.task.acall(*self.with_context(result, args), **kwargs)
        except asyncio.CancelledError:
            raise  # the worker gave up on the attempt (a timeout, shutdown) and settles it
        except Snooze:
            raise
        except BaseException as exc:
            await ctx.run_db(partial(self.failed, ctx, exc))
            raise
        try:
            return json_return_value(self.task, value)
        except (TypeError, ValueError) as exc:
            await ctx.run_db(partial(self.failed, ctx, exc, returned=True))
            raise


def _send(signal: Any, task: Any, **kwargs: Any) -> None:
    for receiver, response in signal.send_robust(CairnQBackend, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "A receiver of the Tasks framework's signals (%r) raised; the task %s is "
                "unaffected.", receiver, task.module_path, exc_info=response,
            )


def _finished(sender: Any, task: Any, **kwargs: Any) -> None:
    """Send the framework's task_finished once a framework task's row is final."""
    framework_task = known_tasks.get(task.name)
    if framework_task is None or split_payload(task.payload) is None:
        return
    result = to_result(framework_task, task, framework_task.backend)
    _send(compat.task_finished, framework_task, task_result=result)


for _name in ("task_succeeded", "task_failed", "task_canceled"):
    getattr(signals, _name).connect(_finished, dispatch_uid=f"cairnq_django.backends.{_name}")
