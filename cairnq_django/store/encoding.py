"""How the store encodes what it writes and decodes what it reads back."""

from __future__ import annotations

from typing import Any

from .. import jsoncodec
from ..errors import SerializationError, error_envelope
from ..jsoncodec import storable
from ..records import TaskRecord, TaskSpec

LEASE_EXPIRED = jsoncodec.dumps(
    error_envelope(
        type="LeaseExpired",
        code="lease_expired",
        message="task lease expired and max attempts reached",
        retryable=False,
    )
)


def inserted_record(spec: TaskSpec, now: int) -> TaskRecord:
    """The row a fresh INSERT of `spec` at `now` holds, without reading it back."""
    return TaskRecord(
        id=spec["id"], name=spec["name"], queue=spec["queue"], status="queued",
        payload=jsoncodec.loads(spec["payload"]), result=None, error=None,
        metadata=jsoncodec.loads(spec["metadata"]), progress=None, message=None,
        attempt=0, max_attempts=spec["max_attempts"], priority=spec["priority"],
        worker_id=None, lease_until_ms=None, run_at_ms=now + spec["delay_ms"],
        cancel_requested_at_ms=None, parent_id=spec["parent_id"], root_id=spec["root_id"],
        correlation_id=spec["correlation_id"], created_at_ms=now, updated_at_ms=now,
        completed_at_ms=None,
    )


def encode_result(result: Any) -> str | None:
    """A handler's result as stored (None is SQL NULL, as the peers store it).

    Raises SerializationError before any write.
    """
    return None if result is None else jsoncodec.dumps(result, what="result")


def error_json(error: Any, retryable: bool) -> str:
    """Encode a failure record; one that is not storable JSON is cut down to its text fields.

    Raising here would leave the task running until its lease expired, over a
    detail nobody can store (an exception message holding a NUL, say).
    """
    try:
        return jsoncodec.dumps(error, what="error")
    except SerializationError:
        fields = error if isinstance(error, dict) else {}
        return jsoncodec.dumps(
            error_envelope(
                type=storable(str(fields.get("type", "Error"))),
                code=storable(str(fields.get("code", "handler_error"))),
                message=storable(str(fields.get("message", error if not fields else ""))),
                retryable=bool(retryable),
            )
        )
