"""How an ending attempt becomes the protocol's JSON error envelope."""

from __future__ import annotations

import traceback
from typing import Any

from ..errors import TaskError, error_envelope


def exception_envelope(exc: BaseException, *, retryable: bool = True) -> dict[str, Any]:
    """Describe an unexpected exception; the traceback goes into details."""
    return error_envelope(
        type=type(exc).__name__,
        code="handler_error",
        message=str(exc) or type(exc).__name__,
        retryable=retryable,
        details={"traceback": "".join(traceback.format_exception(exc))},
    )


def as_envelope(error: Any, retryable: bool) -> tuple[dict[str, Any], bool]:
    """Return (envelope, retryable) for a TaskError, exception, reason string or envelope.

    A TaskError carries its own retryability; everything else takes the caller's.
    """
    if isinstance(error, TaskError):
        envelope = error_envelope(
            type="TaskError", code=error.code, message=error.message,
            retryable=error.retryable, details=error.details,
        )
        return envelope, error.retryable
    if isinstance(error, BaseException):
        return exception_envelope(error, retryable=retryable), retryable
    fields = error if isinstance(error, dict) else {"message": error}  # a reason
    envelope = error_envelope(
        type=str(fields.get("type", "TaskError")),
        code=str(fields.get("code", "task_error")),
        message=str(fields.get("message", "")),
        retryable=retryable,
        details=fields.get("details") or {},
    )
    return envelope, retryable


def timeout_envelope(name: str, max_run_ms: int) -> dict[str, Any]:
    return error_envelope(
        type="HandlerTimeout",
        code="handler_timeout",
        message=(
            f"The handler for {name!r} ran longer than max_run={max_run_ms} ms; "
            "the attempt was abandoned."
        ),
        retryable=True,
    )


def shutdown_envelope(name: str) -> dict[str, Any]:
    return error_envelope(
        type="WorkerShutdown",
        code="worker_shutdown",
        message=(
            f"The worker shut down before the handler for {name!r} finished; "
            "the attempt was abandoned so another worker can run it now."
        ),
        retryable=True,
    )


def unserializable_envelope(exc: BaseException) -> dict[str, Any]:
    return error_envelope(
        type="SerializationError",
        code="unserializable_result",
        message=f"The handler's result cannot be stored as JSON: {exc}",
        retryable=False,
    )
