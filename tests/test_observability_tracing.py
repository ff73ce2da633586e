"""OpenTelemetry: enqueue and attempt spans joined by the traceparent in the task's metadata."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import pytest
from django.db import connection

from cairnq_django import SerializationError, Snooze, enqueue, enqueue_many, get
from cairnq_django.worker import Registry, Worker
from tests.workerutil import ROOT, wait_for

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from cairnq_django.observability import tracing  # noqa: E402

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.connect(provider)
    yield provider, exporter
    tracing.disconnect()


def named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_trace_crosses_from_the_view_to_each_attempt(live_store, spans):
    provider, exporter = spans
    reg = Registry()

    def flaky_then_child(ctx, payload):
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        ctx.submit("obs.child", {})
        return "ok"

    reg.register("obs.traced", flaky_then_child)
    reg.register("obs.child", lambda ctx, payload: "child ok")
    with provider.get_tracer("test").start_as_current_span("view") as view:
        task = enqueue("obs.traced", {}, metadata={"tenant": 7})
    Worker(registry=reg, burst=True, retry_backoff_base_ms=0).run()
    assert get(task.id).status == "succeeded"

    [enq] = named(exporter, "cairnq enqueue obs.traced")
    trace_id = view.get_span_context().trace_id
    assert enq.parent.span_id == view.get_span_context().span_id
    assert enq.kind is SpanKind.PRODUCER and enq.attributes["cairnq.task.id"] == task.id
    # The metadata carries the enqueue span's context, beside the caller's own keys.
    metadata = get(task.id).metadata
    assert metadata["tenant"] == 7
    assert TRACEPARENT.match(metadata["traceparent"]).groups()[:2] == (
        f"{trace_id:032x}", f"{enq.context.span_id:016x}",
    )

    first, second = sorted(named(exporter, "cairnq run obs.traced"),
                           key=lambda s: s.attributes["cairnq.task.attempt"])
    for attempt in (first, second):
        assert attempt.context.trace_id == trace_id
        assert attempt.parent.span_id == enq.context.span_id
        assert attempt.kind is SpanKind.CONSUMER
        assert attempt.attributes["cairnq.task.id"] == task.id
    assert first.attributes["cairnq.task.outcome"] == "retrying"
    assert first.attributes["cairnq.error.code"] == "handler_error"
    assert first.status.status_code is StatusCode.ERROR
    assert second.attributes["cairnq.task.outcome"] == "succeeded"
    assert second.status.status_code is StatusCode.UNSET

    # A child submitted by the second attempt continues the same trace.
    [child_enq] = named(exporter, "cairnq enqueue obs.child")
    [child_run] = named(exporter, "cairnq run obs.child")
    assert child_enq.context.trace_id == trace_id
    assert child_enq.parent.span_id == second.context.span_id
    assert child_run.parent.span_id == child_enq.context.span_id


def test_enqueue_many_traces_each_task_and_leaves_the_callers_dict_alone(store, spans):
    _, exporter = spans
    mine = {"source": "import"}
    a, b = enqueue_many([("obs.a", {}), {"name": "obs.b", "metadata": mine, "queue": "q2"}])
    assert mine == {"source": "import"}
    ids = {s.attributes["cairnq.task.id"]: s for s in exporter.get_finished_spans()}
    assert set(ids) == {a.id, b.id}
    assert ids[b.id].attributes["messaging.destination.name"] == "q2"
    for task in (a, b):
        assert TRACEPARENT.match(get(task.id).metadata["traceparent"])
    assert get(b.id).metadata["source"] == "import"


def test_a_refused_enqueue_ends_its_span_as_an_error(store, spans):
    _, exporter = spans
    with pytest.raises(SerializationError):
        enqueue("obs.bad", {"x": float("nan")})
    [span] = exporter.get_finished_spans()
    assert span.name == "cairnq enqueue obs.bad"
    assert span.status.status_code is StatusCode.ERROR


def test_without_tracing_the_metadata_is_untouched(store):
    task = enqueue("obs.plain", {}, metadata={"k": 1})
    assert get(task.id).metadata == {"k": 1}


def test_a_worker_process_continues_the_trace(live_store, spans, child_env, tmp_path):
    provider, exporter = spans
    with provider.get_tracer("test").start_as_current_span("view"):
        ok = enqueue("tests.echo", {"n": 1})
        bad = enqueue("tests.permanent", {})
    out = tmp_path / "spans.jsonl"
    env = {**child_env, "CAIRNQ_TEST_SPANS": str(out)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.otel_worker", "--burst"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {s["attributes"]["cairnq.task.id"]: s
            for s in map(json.loads, out.read_text().splitlines())}
    enqueues = {s.attributes["cairnq.task.id"]: s for s in exporter.get_finished_spans()
                if s.name.startswith("cairnq enqueue")}
    for task, status in ((ok, "UNSET"), (bad, "ERROR")):
        enq = enqueues[task.id]
        run = runs[task.id]
        assert run["trace_id"] == f"{enq.context.trace_id:032x}"
        assert run["parent_id"] == f"{enq.context.span_id:016x}"
        assert run["kind"] == "CONSUMER" and run["status"] == status
    assert runs[bad.id]["attributes"]["cairnq.error.code"] == "bad_input"


def test_attempts_never_ended_are_bounded(spans, monkeypatch):
    from types import SimpleNamespace

    _, exporter = spans
    monkeypatch.setattr(tracing, "MAX_OPEN_SPANS", 2)
    for n in range(3):
        task = SimpleNamespace(id=f"task_{n}", name="obs.stuck", queue="default", attempt=1,
                               metadata={})
        tracing.on_started(None, task=task)
    [ended] = exporter.get_finished_spans()
    assert ended.attributes["cairnq.task.id"] == "task_0"
    assert ended.attributes["cairnq.task.outcome"] == "abandoned"


def test_a_snoozed_or_canceled_attempt_ends_its_span_with_that_outcome(live_store, spans):
    _, exporter = spans
    reg = Registry()

    def snoozes(ctx, payload):
        raise Snooze(3600)  # far off, so the burst worker stops before the next attempt

    def cancels_itself(ctx, payload):
        live_store.cancel(ctx.task_id)
        return "ignored"

    reg.register("obs.snooze", snoozes)
    reg.register("obs.cancel", cancels_itself)
    snoozed = enqueue("obs.snooze", {})
    canceled = enqueue("obs.cancel", {})
    Worker(registry=reg, burst=True, concurrency=1).run()
    assert get(snoozed.id).status == "queued" and get(canceled.id).status == "canceled"

    # The snoozed row gives its attempt back, but the span of attempt 1 is the one ended.
    [snooze] = named(exporter, "cairnq run obs.snooze")
    assert snooze.attributes["cairnq.task.attempt"] == 1
    assert snooze.attributes["cairnq.task.outcome"] == "snoozed"
    assert snooze.status.status_code is StatusCode.UNSET
    [cancel] = named(exporter, "cairnq run obs.cancel")
    assert cancel.attributes["cairnq.task.outcome"] == "canceled"
    assert cancel.status.status_code is StatusCode.UNSET


def test_a_lost_lease_ends_its_span_as_an_error(live_store, spans):
    _, exporter = spans
    reg = Registry()

    def held_until_stolen(ctx, payload):
        while True:  # reading only, until the test hands the task to another worker
            with connection.cursor() as cursor:
                cursor.execute("SELECT worker_id FROM cairnq_tasks WHERE id = %s", [ctx.task_id])
                if cursor.fetchone()[0] != ctx.worker_id:
                    return "too late"
            time.sleep(0.02)

    reg.register("obs.stolen", held_until_stolen)
    worker = Worker(registry=reg, poll_ms=50)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        task = enqueue("obs.stolen", {})
        wait_for(lambda: get(task.id).status == "running", timeout=30)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE cairnq_tasks SET worker_id = 'worker_OTHER' WHERE id = %s", [task.id]
            )
        wait_for(lambda: named(exporter, "cairnq run obs.stolen"), timeout=30)
    finally:
        worker.stop()
        thread.join(30)
    [run] = named(exporter, "cairnq run obs.stolen")
    assert run.attributes["cairnq.task.outcome"] == "lease_lost"
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "The lease was lost."
