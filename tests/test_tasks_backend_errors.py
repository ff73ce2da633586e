"""A framework task's failures read as Django's own backends record them.

The same task code is run by the framework's ImmediateBackend and by an
in-process CairnQ worker; their TaskResults must name the same exception
class. tests/test_tasks_backend_worker.py does the same with real worker
processes and real signals.
"""

import inspect

import pytest
from django.conf import settings
from django.test import override_settings

import cairnq_django
from cairnq_django import compat

pytestmark = pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed")

if compat.AVAILABLE:
    from cairnq_django.backends.definitions import row_name
    from cairnq_django.backends.handlers import AsyncTaskHandler, TaskHandler
    from cairnq_django.worker import Registry, Worker
    from tests.tasksapp import tasks


def run_worker(*framework_tasks):
    """Run the queued rows of these tasks with an in-process burst worker."""
    registry = Registry()
    for task in framework_tasks:
        handler = AsyncTaskHandler if inspect.iscoroutinefunction(task.func) else TaskHandler
        registry.register(row_name(task), handler(task), queue=task.queue_name)
    # WORKER_CONN_MAX_AGE=None: the connections of an in-process worker's
    # async database threads would otherwise outlive it, and the test database.
    with override_settings(CAIRNQ={"WORKER_CONN_MAX_AGE": None}):
        Worker(registry=registry, burst=True, retry_backoff_base_ms=0, concurrency=1).run()


@pytest.fixture
def immediate():
    """A TASKS alias "immediate" on the framework's own ImmediateBackend."""
    config = {
        **settings.TASKS,
        "immediate": {"BACKEND": f"{compat.SOURCE}.backends.immediate.ImmediateBackend"},
    }
    with override_settings(TASKS=config):
        yield "immediate"


@pytest.mark.parametrize("kind", ["SystemExit", "Halt"])
def test_a_base_exception_fails_the_task_as_the_framework_records_it(
    live_store, immediate, kind
):
    expected = tasks.raise_base.using(backend=immediate).enqueue(kind)
    queued = tasks.raise_base.enqueue(kind)
    after = tasks.add.enqueue(1, 2)

    run_worker(tasks.raise_base, tasks.add)  # returns: the worker survived the task

    queued.refresh()
    assert queued.status == expected.status == "FAILED"
    assert [e.exception_class for e in queued.errors] == [
        e.exception_class for e in expected.errors
    ] == [tasks.RAISABLE[kind]]
    assert f"raised {kind}" in queued.errors[0].traceback
    assert tasks.add.get_result(after.id).return_value == 3


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "Halt"])
def test_an_async_task_raising_a_base_exception(live_store, kind):
    queued = tasks.async_raise_base.enqueue(kind)
    after = tasks.add.enqueue(2, 2)

    run_worker(tasks.async_raise_base, tasks.add)

    queued.refresh()
    assert queued.status == "FAILED"
    assert [e.exception_class for e in queued.errors] == [tasks.RAISABLE[kind]]
    assert tasks.add.get_result(after.id).return_value == 4


def test_keyboard_interrupt_raised_by_a_task_is_its_error(live_store):
    # The ImmediateBackend lets it through (it runs in the caller, where it
    # is the user's Ctrl-C); in a worker it can only be the task's own.
    queued = tasks.raise_base.enqueue("KeyboardInterrupt")
    run_worker(tasks.raise_base)
    queued.refresh()
    assert queued.status == "FAILED"
    assert [e.exception_class for e in queued.errors] == [KeyboardInterrupt]
    assert cairnq_django.get(queued.id).error["type"] == "KeyboardInterrupt"


def test_earlier_attempts_errors_are_kept_whatever_was_raised(live_store):
    failed = tasks.fail_with.enqueue(["RuntimeError", "KeyboardInterrupt", "SystemExit"])
    retried = tasks.fail_with.enqueue(["SystemExit", "Halt"])

    run_worker(tasks.fail_with)

    failed.refresh()
    assert failed.status == "FAILED" and failed.attempts == 3
    assert [e.exception_class for e in failed.errors] == [
        RuntimeError, KeyboardInterrupt, SystemExit
    ]
    assert "attempt 1" in failed.errors[0].traceback
    assert "attempt 3" in failed.errors[2].traceback
    retried.refresh()
    assert retried.status == "SUCCESSFUL" and retried.return_value == 3
    assert [e.exception_class for e in retried.errors] == [SystemExit, tasks.Halt]


def test_a_return_value_that_is_not_json_is_a_type_error(live_store, immediate):
    expected = tasks.not_json.using(backend=immediate).enqueue()
    # Retries allowed, and not used: no attempt would return anything else.
    queued = tasks.not_json.using(max_attempts=3).enqueue()
    queued_async = tasks.async_not_json.using(max_attempts=3).enqueue()

    run_worker(tasks.not_json, tasks.async_not_json)

    assert [e.exception_class for e in expected.errors] == [TypeError]
    for result in (queued, queued_async):
        result.refresh()
        assert (result.status, result.attempts) == ("FAILED", 1)
        assert [e.exception_class for e in result.errors] == [TypeError]
        row = cairnq_django.get(result.id)
        assert (row.status, row.error["code"], row.error["retryable"]) == (
            "failed", "unserializable_result", False
        )
    message = cairnq_django.get(queued_async.id).error["message"]
    assert message.startswith(
        "Unsupported type: <class 'object'>. "
        "tests.tasksapp.tasks.async_not_json returned a value that cannot be stored as JSON: "
        "the return value['when'] is an object;"
    )
