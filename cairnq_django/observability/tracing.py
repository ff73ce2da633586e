"""OpenTelemetry spans (the optional `opentelemetry` extra: opentelemetry-api).

A PRODUCER span `cairnq enqueue <name>` covers each enqueue, and its context
is stored in the task's metadata under the W3C keys `traceparent` (and
`tracestate` when there is one). Each handler attempt runs under a CONSUMER span
`cairnq run <name>` whose parent is read back from that metadata, so the trace
crosses from the view (or the task that submitted a child) to the worker, and
to another language's worker that reads `metadata.traceparent`.

Everything here is a receiver of cairnq_django.signals: connect() turns it on
(CAIRNQ['OPENTELEMETRY'] = True does so at start-up). Spans go to the global
TracerProvider unless connect() is given one; with no SDK configured the API
records nothing and injects nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.dispatch import Signal

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "Tracing needs the OpenTelemetry API: pip install 'cairnq-django[opentelemetry]'."
    ) from exc

from .. import signals
from ..records import TaskRecord

# The W3C Trace Context keys, as every CairnQ implementation reads them from metadata.
TRACE_KEYS = ("traceparent", "tracestate")
INSTRUMENTATION = "cairnq_django"

_propagator = TraceContextTextMapPropagator()
_provider: Any = None
_lock = threading.Lock()
# Open spans: enqueue spans by id() of the metadata dict both signals carry,
# attempt spans by (task id, attempt).
_enqueue_spans: dict[int, Any] = {}
_attempt_spans: dict[tuple[str, int], Any] = {}
# An attempt whose end is never signalled (its settling write failed and lease
# recovery will decide) would stay open for ever; past this many, the oldest
# open span is ended as abandoned.
MAX_OPEN_SPANS = 10_000


def _tracer() -> Any:
    provider = _provider or trace.get_tracer_provider()
    return provider.get_tracer(INSTRUMENTATION)


def context_from_metadata(metadata: Any) -> otel_context.Context | None:
    """The trace context a task's metadata carries, or None."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("traceparent"), str):
        return None
    carrier = {k: metadata[k] for k in TRACE_KEYS if isinstance(metadata.get(k), str)}
    return _propagator.extract(carrier)


def attempt_context(ctx: Any) -> otel_context.Context | None:
    """The context of the span of a running attempt, for a handler's own child spans.

        with tracer.start_as_current_span("resize", context=attempt_context(ctx)): ...
    """
    with _lock:
        span = _attempt_spans.get((ctx.task_id, ctx.attempt))
    return trace.set_span_in_context(span) if span is not None else None


# ------------------------------------------------------------ enqueue


def on_enqueuing(
    sender: None,
    name: str,
    queue: str,
    metadata: dict[str, Any],
    parent: TaskRecord | None = None,
    **kwargs: Any,
) -> None:
    # The caller's current span, else the trace the metadata already carries,
    # else (ctx.submit) the attempt that submits the child.
    parent_ctx = None
    if not trace.get_current_span().get_span_context().is_valid:
        parent_ctx = context_from_metadata(metadata)
        if parent_ctx is None and parent is not None:
            with _lock:
                span = _attempt_spans.get((parent.id, parent.attempt))
            if span is not None:
                parent_ctx = trace.set_span_in_context(span)
    span = _tracer().start_span(
        f"cairnq enqueue {name}", context=parent_ctx, kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "cairnq",
            "messaging.operation.type": "send",
            "messaging.destination.name": queue,
            "cairnq.task.name": name,
        },
    )
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    if carrier:
        for key in TRACE_KEYS:
            metadata.pop(key, None)
        metadata.update(carrier)
    _keep(_enqueue_spans, id(metadata), span)


def on_enqueued(
    sender: None,
    metadata: dict[str, Any],
    task: Any = None,  # a TaskRecord, or an on_commit PendingTask: only its id is read
    error: BaseException | None = None,
    **kwargs: Any,
) -> None:
    with _lock:
        span = _enqueue_spans.pop(id(metadata), None)
    if span is None:
        return
    if task is not None:
        span.set_attribute("cairnq.task.id", task.id)
        span.set_attribute("messaging.message.id", task.id)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


# ------------------------------------------------------------ attempts


def on_started(sender: type, task: TaskRecord, worker: object = None, **kwargs: Any) -> None:
    span = _tracer().start_span(
        f"cairnq run {task.name}", context=context_from_metadata(task.metadata),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "cairnq",
            "messaging.operation.type": "process",
            "messaging.destination.name": task.queue,
            "messaging.message.id": task.id,
            "cairnq.task.id": task.id,
            "cairnq.task.name": task.name,
            "cairnq.task.attempt": task.attempt,
            "cairnq.worker.id": getattr(worker, "worker_id", "") or "",
        },
    )
    _keep(_attempt_spans, (task.id, task.attempt), span)


def _keep(spans: dict, key: Any, span: Any) -> None:
    with _lock:
        spans[key] = span
        evicted = spans.pop(next(iter(spans))) if len(spans) > MAX_OPEN_SPANS else None
    if evicted is not None:
        evicted.set_attribute("cairnq.task.outcome", "abandoned")
        evicted.end()


# The outcome each signal that ends an attempt writes on the attempt's span.
_OUTCOMES = {
    signals.task_succeeded: "succeeded",
    signals.task_failed: "failed",
    signals.task_retrying: "retrying",
    signals.task_snoozed: "snoozed",
    signals.task_canceled: "canceled",
    signals.task_lease_lost: "lease_lost",
}


def on_ended(sender: type, signal: Signal, task: TaskRecord, error: Any = None, **kwargs: Any) -> None:
    outcome = _OUTCOMES[signal]
    # The snooze gave the claimed attempt back, so the row reads one less
    # than the attempt whose span is open.
    attempt = task.attempt + 1 if outcome == "snoozed" else task.attempt
    with _lock:
        span = _attempt_spans.pop((task.id, attempt), None)
    if span is None:
        return
    span.set_attribute("cairnq.task.outcome", outcome)
    if isinstance(error, dict):
        span.set_attribute("cairnq.error.code", str(error.get("code")))
        span.set_status(Status(StatusCode.ERROR, str(error.get("message"))))
    elif outcome == "lease_lost":
        span.set_status(Status(StatusCode.ERROR, "The lease was lost."))
    span.end()


_RECEIVERS: tuple[tuple[Signal, Callable[..., None]], ...] = (
    (signals.task_enqueuing, on_enqueuing),
    (signals.task_enqueued, on_enqueued),
    (signals.task_started, on_started),
    *((signal, on_ended) for signal in _OUTCOMES),
)


def connect(tracer_provider: Any = None) -> None:
    """Trace enqueues and attempts in this process (idempotent)."""
    global _provider
    _provider = tracer_provider
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, dispatch_uid=f"cairnq-tracing-{receiver.__name__}")


def disconnect() -> None:
    global _provider
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=f"cairnq-tracing-{receiver.__name__}")
    _provider = None
    with _lock:
        _enqueue_spans.clear()
        _attempt_spans.clear()
