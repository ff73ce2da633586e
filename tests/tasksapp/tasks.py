"""Framework tasks the worker discovers as an installed app's tasks module."""

import asyncio
import os
import time

from cairnq_django.compat import task, task_finished, task_started

SIGNAL_LOG = "CAIRNQ_TASKS_SIGNAL_LOG"


@task
def add(a, b):
    return a + b


@task(queue_name="tasks-other", priority=10)
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


# CairnQ options through .using(): Django 6.0's @task takes no extra
# arguments (tests/tasksapp/decorated.py uses the decorator form).
def fail_until(context, attempt):
    """Raise until the given attempt, then report what the context saw."""
    if context.attempt < attempt:
        raise RuntimeError(f"not yet: attempt {context.attempt}")
    return {
        "attempt": context.attempt,
        "attempts": context.task_result.attempts,
        "worker_ids": len(context.task_result.worker_ids),
        "id": context.task_result.id,
    }


fail_until = task(takes_context=True)(fail_until).using(max_attempts=3)


@task
def boom(message):
    raise ValueError(message)


def greet(name):
    return f"hello {name}"


greet = task(greet).using(cairnq_name="tests.shared_greet")


@task
def not_json():
    return object()


@task
async def async_not_json():
    return {"when": object()}


class Halt(BaseException):
    """Neither an Exception nor one of Python's own: a task may raise it all the same."""


RAISABLE = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt, "Halt": Halt,
            "RuntimeError": RuntimeError}


@task
def raise_base(kind):
    raise RAISABLE[kind](f"raised {kind}")


@task
async def async_raise_base(kind):
    raise RAISABLE[kind](f"raised {kind}")


def fail_with(context, kinds):
    """Raise RAISABLE[kinds[n - 1]] on attempt n, then return the attempt."""
    if context.attempt <= len(kinds):
        raise RAISABLE[kinds[context.attempt - 1]](f"attempt {context.attempt}")
    return context.attempt


fail_with = task(takes_context=True)(fail_with).using(max_attempts=3)


@task
def wait_for_file(path):
    """Return once `path` exists (a test creates it when it is ready)."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)
    return "opened"


def _log_signal(kind, task_result, **kwargs):
    path = os.environ.get(SIGNAL_LOG)
    if path:
        with open(path, "a") as log:
            log.write(f"{kind} {task_result.id} {task_result.status}\n")


def _started(sender, task_result, **kwargs):
    _log_signal("started", task_result)


def _finished(sender, task_result, **kwargs):
    _log_signal("finished", task_result)


task_started.connect(_started, dispatch_uid="tests.tasksapp.started")
task_finished.connect(_finished, dispatch_uid="tests.tasksapp.finished")
