"""A CairnQ row read as the framework's TaskResult, and a failure written for it.

The framework has no canceled status: a canceled row reads as FAILED (so
`is_finished` holds) with a TaskCanceled error; `cairnq_django.get(result.id)`
still has the real status. Times come from the row (`enqueued_at`: created,
`finished_at`: completed) and from the attempts the worker records in the
row's metadata under ATTEMPTS_KEY (`started_at`: the first attempt's start,
`last_attempted_at`: the latest one's). `worker_ids` has one entry per attempt.
Errors come from the error envelope, which keeps the earlier attempts' errors.
"""

from __future__ import annotations

import json
import traceback
from datetime import UTC, datetime
from typing import Any

from .. import compat
from ..errors import TaskError as CairnQTaskError
from ..errors import error_envelope
from ..records import TaskRecord
from .discovery import find_task

# Reserved metadata key (framework convention: `_` keys belong to the backend).
ATTEMPTS_KEY = "_django_task_attempts"
# How many earlier errors an envelope keeps, and attempts the metadata keeps.
MAX_ERRORS = 20
MAX_ATTEMPTS_KEPT = 100

_STATUS = {
    "queued": compat.TaskResultStatus.READY,
    "running": compat.TaskResultStatus.RUNNING,
    "succeeded": compat.TaskResultStatus.SUCCESSFUL,
    "failed": compat.TaskResultStatus.FAILED,
    "canceled": compat.TaskResultStatus.FAILED,
}
_CANCELED_CLASS = "cairnq_django.errors.TaskCanceled"
_FOREIGN_CLASS = "cairnq_django.errors.TaskError"


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def split_payload(payload: Any) -> tuple[list[Any], dict[str, Any]] | None:
    """(args, kwargs) of a framework task's payload, or None if it has another shape."""
    if not isinstance(payload, dict) or set(payload) - {"args", "kwargs"}:
        return None
    args, kwargs = payload.get("args", []), payload.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    return args, kwargs


def attempts_of(record: TaskRecord) -> list[dict[str, Any]]:
    """The attempts the worker recorded in the row's metadata ([] if none)."""
    metadata = record.metadata if isinstance(record.metadata, dict) else {}
    attempts = metadata.get(ATTEMPTS_KEY)
    if not isinstance(attempts, list):
        return []
    return [a for a in attempts if isinstance(a, dict)]


def with_attempt(record: TaskRecord) -> dict[str, Any]:
    """The row's metadata with the attempt just claimed (by record.worker_id) added."""
    metadata = dict(record.metadata) if isinstance(record.metadata, dict) else {}
    attempt = {
        "attempt": record.attempt,
        "worker_id": record.worker_id,
        # A claim stamps updated_at_ms with the claiming statement's clock.
        "started_at_ms": record.updated_at_ms,
    }
    metadata[ATTEMPTS_KEY] = [*attempts_of(record), attempt][-MAX_ATTEMPTS_KEPT:]
    return metadata


def _worker_ids(record: TaskRecord, attempts: list[dict[str, Any]]) -> list[str]:
    # One entry per attempt, so TaskResult.attempts is the row's attempt. An
    # attempt nothing recorded (another implementation's worker ran it, or
    # its start is not written yet) is credited to the row's last worker.
    by_attempt = {a.get("attempt"): str(a.get("worker_id") or "") for a in attempts}
    return [by_attempt.get(n, record.worker_id or "") for n in range(1, record.attempt + 1)]


def _errors(record: TaskRecord) -> list[Any]:
    errors = []
    envelope = record.error if isinstance(record.error, dict) else None
    if envelope is not None:
        raw = envelope.get("details")
        details: dict[str, Any] = raw if isinstance(raw, dict) else {}
        for earlier in details.get("earlier_errors") or []:
            if isinstance(earlier, dict):
                errors.append(_task_error(earlier))
        errors.append(_task_error(details, envelope))
    if record.status == "canceled":
        errors.append(
            compat.TaskError(
                exception_class_path=_CANCELED_CLASS, traceback=f"Task {record.id} was canceled."
            )
        )
    return errors


def _task_error(details: dict[str, Any], envelope: dict[str, Any] | None = None) -> Any:
    path = details.get("exception_class_path")
    text = details.get("traceback")
    if not isinstance(path, str) or not path:
        # Written by another implementation or by the worker itself (a
        # timeout, an expired lease): no Python exception to name.
        path = _FOREIGN_CLASS
    if not isinstance(text, str) or not text:
        env = envelope or {}
        text = f"{env.get('type', 'Error')} ({env.get('code', 'error')}): {env.get('message', '')}"
    return compat.TaskError(exception_class_path=path, traceback=text)


def to_result(task: Any, record: TaskRecord, backend_alias: str) -> Any:
    """Build the TaskResult a row stands for."""
    attempts = attempts_of(record)
    split = split_payload(record.payload) or ([], {})
    result: Any = compat.TaskResult(
        task=task,
        id=record.id,
        status=_STATUS[record.status],
        enqueued_at=_time(record.created_at_ms),
        started_at=_time(attempts[0].get("started_at_ms")) if attempts else None,
        finished_at=_time(record.completed_at_ms) if record.is_terminal else None,
        last_attempted_at=_time(attempts[-1].get("started_at_ms")) if attempts else None,
        args=split[0],
        kwargs=split[1],
        backend=backend_alias,
        errors=_errors(record),
        worker_ids=_worker_ids(record, attempts),
        **_metadata_field(record),
    )
    if record.status == "succeeded":
        object.__setattr__(result, "_return_value", record.result)
    return result


def _metadata_field(record: TaskRecord) -> dict[str, Any]:
    if not compat.HAS_METADATA:
        return {}
    metadata = {
        k: v for k, v in (record.metadata or {}).items() if k != ATTEMPTS_KEY
    } if isinstance(record.metadata, dict) else {}
    metadata["_progress"], metadata["_message"] = record.progress, record.message
    return {"metadata": metadata}


def pending_result(task: Any, task_id: str, args: list, kwargs: dict, backend_alias: str) -> Any:
    """The TaskResult of an enqueue that waits for the caller's commit to be written."""
    return compat.TaskResult(
        task=task, id=task_id, status=compat.TaskResultStatus.READY, enqueued_at=None,
        started_at=None, finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
        backend=backend_alias, errors=[], worker_ids=[],
    )


def failure_envelope(
    exc: BaseException, record: TaskRecord, *, unserializable_result: bool = False
) -> tuple[dict[str, Any], bool]:
    """(envelope, retryable) for an exception a framework task raised on this attempt.

    The envelope reads like any other handler error to other implementations;
    its details add the exception's class path, the traceback, and the errors
    of earlier attempts (from the previous envelope), newest last.
    `unserializable_result`: `exc` says the return value is not JSON; that
    fails the task for good, with the code the worker gives such a result.
    """
    earlier = []
    previous = record.error if isinstance(record.error, dict) else None
    if previous is not None and record.attempt > 1:
        raw = previous.get("details")
        details: dict[str, Any] = raw if isinstance(raw, dict) else {}
        earlier = [e for e in details.get("earlier_errors") or [] if isinstance(e, dict)]
        earlier.append(
            {
                "exception_class_path": details.get("exception_class_path"),
                "traceback": details.get("traceback")
                or f"{previous.get('type')} ({previous.get('code')}): {previous.get('message')}",
            }
        )
    cls = type(exc)
    details = {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
        "earlier_errors": earlier[-MAX_ERRORS:],
    }
    if isinstance(exc, CairnQTaskError):
        envelope = error_envelope(
            type="TaskError", code=exc.code, message=exc.message, retryable=exc.retryable,
            details={**(exc.details or {}), **details},
        )
        return envelope, exc.retryable
    retryable = not unserializable_result
    envelope = error_envelope(
        type=cls.__name__,
        code="unserializable_result" if unserializable_result else "handler_error",
        message=str(exc) or cls.__name__, retryable=retryable, details=details,
    )
    return envelope, retryable


_MAX_CALL_TEXT = 1_000


def describe_call(name: str, payload: Any) -> str | None:
    """`module.path(1, x="y")` for a framework task's row, or None for any other row.

    Only tasks this process knows (or discovers) count: a name is never imported.
    """
    split = split_payload(payload)
    if split is None:
        return None
    task = find_task(name)
    if task is None:
        return None
    args, kwargs = split
    parts = [json.dumps(value, ensure_ascii=False) for value in args]
    parts += [f"{key}={json.dumps(value, ensure_ascii=False)}" for key, value in kwargs.items()]
    text = f"{task.module_path}({', '.join(parts)})"
    return text if len(text) <= _MAX_CALL_TEXT else text[: _MAX_CALL_TEXT - 1] + "…"
