"""The protocol's state transitions as `update()` value sets.

Each function returns the column assignments of one transition, written with
F(), Case/When and the queue's clock. The WHERE that guards a transition (who
owns the row, which statuses it may leave) is a QuerySet method; the store
pairs the two. Every CASE reads the row as it was before the update.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Case, F, Q, TextField, Value, When
from django.db.models.functions import Coalesce

from .expressions import JsonParam, NowMs, bool_param, float_param, int_param, now_plus, text_param

_CANCEL_PENDING = Q(cancel_requested_at_ms__isnull=False)


def _text(value: str) -> Value:
    return Value(value, output_field=TextField())


def _if(condition: Q, then: Any, otherwise: Any) -> Case:
    return Case(When(condition, then=then), default=otherwise)


def claim() -> dict[str, Any]:
    """queued -> running under a fresh lease, one attempt more."""
    return {
        "status": _text("running"),
        "worker_id": text_param("worker_id"),
        "lease_until_ms": now_plus(int_param("lease_ms")),
        "attempt": F("attempt") + 1,
        "updated_at_ms": NowMs(),
    }


def recover_lease() -> dict[str, Any]:
    """An expired lease: canceled if a cancel is pending, else requeued while attempts remain, else failed."""
    attempts_left = Q(attempt__lt=F("max_attempts"))
    requeue = Q(cancel_requested_at_ms__isnull=True) & attempts_left
    return {
        "status": Case(
            When(_CANCEL_PENDING, then=_text("canceled")),
            When(attempts_left, then=_text("queued")),
            default=_text("failed"),
        ),
        "worker_id": _if(requeue, Value(None), F("worker_id")),
        "lease_until_ms": Value(None),
        "run_at_ms": _if(requeue, NowMs(), F("run_at_ms")),
        "error": Case(
            When(Q(cancel_requested_at_ms__isnull=True) & Q(attempt__gte=F("max_attempts")),
                 then=JsonParam("lease_error")),
            default=F("error"),
        ),
        "completed_at_ms": _if(requeue, F("completed_at_ms"), NowMs()),
        "progress": _if(requeue, Value(None), F("progress")),
        "message": _if(requeue, Value(None), F("message")),
        "updated_at_ms": NowMs(),
    }


def renew() -> dict[str, Any]:
    return {"lease_until_ms": now_plus(int_param("lease_ms")), "updated_at_ms": NowMs()}


def report_progress() -> dict[str, Any]:
    """Progress and message, each kept when not given."""
    return {
        "progress": Coalesce(float_param("progress"), F("progress")),
        "message": Coalesce(text_param("message"), F("message")),
        "updated_at_ms": NowMs(),
    }


def succeed() -> dict[str, Any]:
    """running -> succeeded, a pending cancel notwithstanding."""
    return {
        "status": _text("succeeded"),
        "result": JsonParam("result"),
        "progress": Value(1.0),
        "lease_until_ms": Value(None),
        "completed_at_ms": NowMs(),
        "updated_at_ms": NowMs(),
    }


def complete(result: Any = None) -> dict[str, Any]:
    """running -> succeeded with the result, or canceled when a cancel is pending (cancel wins)."""
    return {
        "status": Case(When(_CANCEL_PENDING, then=_text("canceled")), default=_text("succeeded")),
        "result": Case(When(_CANCEL_PENDING, then=F("result")),
                       default=result if result is not None else JsonParam("result")),
        "progress": Case(When(_CANCEL_PENDING, then=F("progress")), default=Value(1.0)),
        "lease_until_ms": Value(None),
        "completed_at_ms": NowMs(),
        "updated_at_ms": NowMs(),
    }


def _leave_running(requeue: Q) -> dict[str, Any]:
    """What a fail and a snooze both write: back to the queue after delay_ms, or settled now."""
    return {
        "worker_id": _if(requeue, Value(None), F("worker_id")),
        "lease_until_ms": Value(None),
        "run_at_ms": _if(requeue, now_plus(int_param("delay_ms")), F("run_at_ms")),
        "completed_at_ms": _if(requeue, Value(None), NowMs()),
        "progress": _if(requeue, Value(None), F("progress")),
        "message": _if(requeue, Value(None), F("message")),
        "updated_at_ms": NowMs(),
    }


def fail() -> dict[str, Any]:
    """running -> queued (retryable, attempts left, after delay_ms), failed, or canceled if requested."""
    retryable = bool_param("retryable")
    attempts_left = Q(attempt__lt=F("max_attempts"))
    requeue = Q(cancel_requested_at_ms__isnull=True) & Q(retryable) & attempts_left
    return {
        "status": Case(
            When(_CANCEL_PENDING, then=_text("canceled")),
            When(Q(bool_param("retryable")) & attempts_left, then=_text("queued")),
            default=_text("failed"),
        ),
        "error": JsonParam("error"),
        **_leave_running(requeue),
    }


def snooze() -> dict[str, Any]:
    """running -> queued after delay_ms with the attempt given back, or canceled if requested.

    Unlike a retryable fail it writes no error (the row keeps the one it had)
    and undoes the claim's attempt += 1, so max_attempts counts real failures.
    """
    requeue = ~_CANCEL_PENDING
    return {
        "status": _if(requeue, _text("queued"), _text("canceled")),
        "attempt": _if(requeue & Q(attempt__gt=0), F("attempt") - 1, F("attempt")),
        **_leave_running(requeue),
    }


def cancel() -> dict[str, Any]:
    """queued -> canceled; running -> cancel requested (the worker settles it)."""
    return {
        "status": Case(When(status="queued", then=_text("canceled")), default=F("status")),
        "cancel_requested_at_ms": Case(
            When(status="running", then=NowMs()), default=F("cancel_requested_at_ms")
        ),
        "completed_at_ms": Case(When(status="queued", then=NowMs()), default=F("completed_at_ms")),
        "updated_at_ms": NowMs(),
    }


def retry() -> dict[str, Any]:
    """failed/canceled -> queued, due now; the attempt count kept unless reset."""
    return {
        "status": _text("queued"),
        "error": None,  # SQL NULL (Value(None) would be JSON null)
        "worker_id": Value(None),
        "lease_until_ms": Value(None),
        "run_at_ms": NowMs(),
        "cancel_requested_at_ms": Value(None),
        "completed_at_ms": Value(None),
        "progress": Value(None),
        "message": Value(None),
        "attempt": Case(When(Q(bool_param("reset")), then=Value(0)), default=F("attempt")),
        "updated_at_ms": NowMs(),
    }


def replace_metadata() -> dict[str, Any]:
    """The row's metadata, as a lease holder rewrites it (the framework's attempt log).

    updated_at_ms keeps the claim's stamp, which the attempt log records as the
    attempt's start.
    """
    return {"metadata": JsonParam("metadata")}
