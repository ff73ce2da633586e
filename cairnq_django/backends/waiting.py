"""A bounded wait for a framework task's result (the framework itself has none)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .. import client


def wait_for_result(result: Any, *, timeout: float | timedelta | None = 30) -> Any:
    """Block until the task of `result` finishes; return its refreshed TaskResult.

    Raises cairnq_django.TaskTimeout when `timeout` (seconds) passes first; the
    task keeps going. A failed or canceled task is returned as it is (status
    FAILED, with its errors), not raised.
    """
    backend = result.task.get_backend()
    client.wait(result.id, timeout=timeout, raise_on_failure=False, using=backend.database)
    return backend.get_result(result.id)


async def await_result(result: Any, *, timeout: float | timedelta | None = 30) -> Any:
    """See wait_for_result(); the sleeps between probes hold no thread."""
    backend = result.task.get_backend()
    await client.await_task(
        result.id, timeout=timeout, raise_on_failure=False, using=backend.database
    )
    return await backend.aget_result(result.id)
