"""A framework task with a cairnq_name, run and enqueued by the `cairnq` SDK (0.15.1)."""

import pytest
from django.conf import settings
from django.test import override_settings

from cairnq_django import compat
from tests.peer import with_sdk

pytestmark = pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed")

if compat.AVAILABLE:
    from cairnq_django.backends.handlers import register_framework_tasks
    from cairnq_django.testing import TaskRunner
    from cairnq_django.worker.registry import Registry
    from tests.tasksapp import tasks


def test_the_sdk_runs_a_framework_task_django_enqueued(live_store):
    done = tasks.greet.enqueue("ann")
    failed = tasks.greet.enqueue("bob")

    async def work(client):
        claimed = await client.store.claim(
            queues=["default"], worker_id="sdk-1", names=["tests.shared_greet"], limit=2
        )
        payloads = {task.id: task.payload for task in claimed}
        await client.store.complete(
            task_id=done.id, worker_id="sdk-1",
            result=f"hi {payloads[done.id]['args'][0]}",
        )
        await client.store.fail(
            task_id=failed.id, worker_id="sdk-1", retryable=False,
            error={"type": "Refused", "code": "no_bob", "message": "not bob", "retryable": False,
                   "details": {}},
        )
        return payloads

    payloads = with_sdk(work)

    assert payloads[done.id] == {"args": ["ann"], "kwargs": {}}
    result = tasks.greet.get_result(done.id)
    assert (result.status, result.return_value, result.attempts) == ("SUCCESSFUL", "hi ann", 1)
    assert result.worker_ids == ["sdk-1"]
    refused = tasks.greet.get_result(failed.id)
    assert refused.status == "FAILED"
    [error] = refused.errors
    assert error.exception_class_path == "cairnq_django.errors.TaskError"
    assert error.traceback == "Refused (no_bob): not bob"


def test_django_runs_a_framework_task_the_sdk_enqueued(live_store):
    async def submit(client):
        return await client.submit("tests.shared_greet", {"args": [], "kwargs": {"name": "cy"}})

    submitted = with_sdk(submit)
    config = {**settings.TASKS["default"], "OPTIONS": {"MODULES": ["tests.tasksapp.tasks"]}}
    registry = Registry()
    with override_settings(TASKS={"default": config}):
        assert "tests.shared_greet" in register_framework_tasks(registry)
    [ran] = TaskRunner(registry=registry).drain()

    assert ran.task.id == submitted.id and ran.status == "succeeded"
    result = tasks.greet.get_result(submitted.id)
    assert result.return_value == "hello cy" and result.kwargs == {"name": "cy"}

    async def read(client):
        return await client.get(submitted.id)

    assert with_sdk(read).result == "hello cy"
