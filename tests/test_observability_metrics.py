"""Prometheus: the worker's counters scraped from a real worker, and the gauges view."""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection

from cairnq_django import enqueue, get, signals
from cairnq_django.errors import HeartbeatLate
from cairnq_django.models import WorkerRecord
from cairnq_django.observability.overview import database_now_ms
from cairnq_django.worker import Registry, Worker
from tests.workerutil import WorkerProcess, wait_for

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cairnq_django.observability import metrics  # noqa: E402


def samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted label pairs): value} from exposition text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict, metric: str, /, **labels) -> float | None:
    return found.get((metric, tuple(sorted(labels.items()))))


def test_a_worker_serves_its_counters_and_histograms(live_store, child_env):
    ok = [enqueue("tests.echo", {"n": n}) for n in range(2)]
    bad = enqueue("tests.permanent", {})
    flaky = enqueue("tests.flaky", {"succeed_on": 2}, queue="mail")
    worker = WorkerProcess(
        child_env, "-v", "2", "--queue", "default", "--queue", "mail", "--metrics-port", "0",
        settings={"RETRY_BACKOFF_BASE": 0},
    )
    try:
        match = wait_for(
            lambda: re.search(r"Serving worker metrics on http://[^:]+:(\d+)/metrics",
                              worker.output()),
            timeout=60, message="The worker did not log its metrics address.",
        )
        url = f"http://127.0.0.1:{match.group(1)}/metrics"
        for task in [*ok, bad, flaky]:
            wait_for(lambda task=task: get(task.id).status in ("succeeded", "failed"), timeout=60)

        def scrape():
            found = samples(urllib.request.urlopen(url, timeout=10).read().decode())
            # Signals follow the commit: wait until every finish is counted.
            finished = [
                value(found, "cairnq_worker_tasks_finished_total", queue=queue, name=name,
                      status=status)
                for queue, name, status in [("mail", "tests.flaky", "succeeded"),
                                            ("default", "tests.echo", "succeeded"),
                                            ("default", "tests.permanent", "failed")]
            ]
            return found if None not in finished and finished[1] == 2 else None

        found = wait_for(scrape, timeout=60)
    finally:
        worker.stop()
    finished = "cairnq_worker_tasks_finished_total"
    assert value(found, finished, queue="default", name="tests.echo", status="succeeded") == 2
    assert value(found, finished, queue="default", name="tests.permanent", status="failed") == 1
    assert value(found, "cairnq_worker_task_retries_total", queue="mail",
                 name="tests.flaky") == 1
    assert value(found, "cairnq_worker_tasks_started_total", queue="mail",
                 name="tests.flaky") == 2
    # One observation per attempt, whatever its outcome.
    assert value(found, "cairnq_worker_task_duration_seconds_count", queue="mail",
                 name="tests.flaky") == 2
    assert value(found, "cairnq_worker_task_duration_seconds_bucket", queue="default",
                 name="tests.echo", le="+Inf") == 2
    assert value(found, "cairnq_worker_heartbeats_late_total") == 0


@pytest.fixture
def counted():
    registry = prometheus_client.CollectorRegistry()
    metrics.connect_worker_metrics(registry)
    yield registry
    metrics.disconnect_worker_metrics()
    for metric in metrics.WORKER_METRICS:
        registry.unregister(metric)


def test_lease_losses_and_late_heartbeats_are_counted(live_store, counted):
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
    before = prometheus_client.generate_latest(counted).decode()
    thread.start()
    try:
        task = enqueue("obs.stolen", {})
        wait_for(lambda: get(task.id).status == "running", timeout=30)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE cairnq_tasks SET worker_id = 'worker_OTHER' WHERE id = %s", [task.id]
            )

        def lost():
            found = samples(prometheus_client.generate_latest(counted).decode())
            return value(found, "cairnq_worker_lease_losses_total", queue="default",
                         name="obs.stolen") == 1
        wait_for(lost, timeout=30)
        worker._report_late_heartbeat(
            HeartbeatLate(late_ms=900, interval_ms=100, lease_ms=300, task_ids=[task.id])
        )
    finally:
        worker.stop()
        thread.join(30)
    found = samples(prometheus_client.generate_latest(counted).decode())
    late_before = value(samples(before), "cairnq_worker_heartbeats_late_total")
    assert value(found, "cairnq_worker_heartbeats_late_total") == late_before + 1
    assert get(task.id).result is None  # the stolen attempt wrote nothing


def test_a_signal_receiver_sees_the_new_signals(live_store):
    seen = []

    def receiver(sender, **kwargs):
        seen.append(kwargs["error"].late_ms)

    signals.heartbeat_late.connect(receiver)
    try:
        Worker(registry=Registry())._report_late_heartbeat(
            HeartbeatLate(late_ms=5, interval_ms=1, lease_ms=3, task_ids=[])
        )
    finally:
        signals.heartbeat_late.disconnect(receiver)
    assert seen == [5]


@pytest.fixture
def queue_rows(store):
    now = database_now_ms("default")
    WorkerRecord.objects.create(
        id="worker_M", host="h", pid=1, queues=["default"], concurrency=1, version="0",
        started_at_ms=now, last_seen_ms=now, interval_ms=10_000,
    )
    enqueue("tests.echo", {})
    enqueue("tests.echo", {}, queue="mail")


def test_the_view_serves_database_gauges_to_a_token(client, queue_rows, settings):
    settings.CAIRNQ = {"METRICS_TOKEN": "s3cret"}
    assert client.get("/cairnq/metrics").status_code == 401
    assert client.get("/cairnq/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/cairnq/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())
    assert value(found, "cairnq_tasks", queue="default", status="queued") == 1
    assert value(found, "cairnq_tasks", queue="mail", status="queued") == 1
    assert value(found, "cairnq_tasks", queue="mail", status="running") == 0
    assert value(found, "cairnq_oldest_due_task_age_seconds", queue="mail") >= 0
    assert value(found, "cairnq_queue_live_workers", queue="default") == 1
    assert value(found, "cairnq_queue_live_workers", queue="mail") == 0
    assert value(found, "cairnq_workers", state="live") == 1
    assert value(found, "cairnq_workers", state="gone") == 0
    # The database gauges only: no worker counters and no process metrics here.
    assert not [key for key in found if key[0].startswith(("cairnq_worker_", "process_"))]


def test_the_view_needs_the_view_permission_without_a_token(client, queue_rows):
    user = User.objects.create_user("ops", password="pw")
    client.force_login(user)
    assert client.get("/cairnq/metrics").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(User.objects.get(pk=user.pk))
    response = client.get("/cairnq/metrics")
    assert response.status_code == 200
    assert b"cairnq_tasks{" in response.content
