"""Prometheus metrics (the optional `prometheus` extra: prometheus_client).

Two halves, because they are true in different places:

- Gauges read from the database (QueueCollector): tasks by queue and status,
  the age of each queue's oldest due task, live and gone workers, and each
  flow limit's use (running, starts in its window, held back). Any process
  can compute them and they are right however many workers run, so they are
  served by a view you mount in your urls (see views.metrics).
- Counters and histograms counted by each worker as its tasks run
  (connect_worker_metrics), from the receivers of cairnq_django.signals below.
  `cairnq_worker --metrics-port` serves them from the worker process.

Each worker serves its own port rather than sharing Prometheus' multiprocess
mode: a worker is one long-lived process with threads, not a pool of forked
children, so there is nothing to aggregate across processes, and multiprocess
mode's shared directory and lost custom collectors buy nothing. Prometheus sums
the workers' series with `sum by (name, status)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.dispatch import Signal

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import GaugeMetricFamily
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "Prometheus metrics need prometheus_client: pip install 'cairnq-django[prometheus]'."
    ) from exc

from .. import signals
from ..records import STATUSES, TERMINAL_STATUSES, TaskRecord
from . import DEFAULT_METRICS_ADDR
from .overview import Overview, overview

logger = logging.getLogger("cairnq_django.worker")

# ------------------------------------------------------------ database side


class QueueCollector:
    """Gauges read from the queue's database at each scrape."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    def describe(self) -> list:
        return []  # read the database only when scraped, not at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = overview(self.using)
        tasks = GaugeMetricFamily(
            "cairnq_tasks", "Tasks in the table by queue and status.", labels=["queue", "status"]
        )
        oldest = GaugeMetricFamily(
            "cairnq_oldest_due_task_age_seconds",
            "How long the oldest due queued task of each queue has waited (0: none due).",
            labels=["queue"],
        )
        serving = GaugeMetricFamily(
            "cairnq_queue_live_workers", "Live workers serving each queue.", labels=["queue"]
        )
        for q in view.queues:
            for status in STATUSES:
                tasks.add_metric([q.queue, status], q.counts[status])
            oldest.add_metric([q.queue], (q.oldest_due_age_ms or 0) / 1000)
            serving.add_metric([q.queue], len(view.live_workers_for(q.queue)))
        workers = GaugeMetricFamily(
            "cairnq_workers", "Workers in the workers table, live or gone.", labels=["state"]
        )
        live = sum(w.live for w in view.workers)
        workers.add_metric(["live"], live)
        workers.add_metric(["gone"], len(view.workers) - live)
        yield from (tasks, oldest, serving, workers)
        yield from limit_gauges(view)


def limit_gauges(view: Overview) -> Iterator[GaugeMetricFamily]:
    """One series per flow limit in force and gauge, labelled by its scope and value.

    A limit without a concurrency has no cairnq_flow_limit_concurrency
    series, one without a rate no rate or starts series, so an alert on
    `running >= concurrency` only matches limits that have both.
    """
    labels = ["scope", "value"]

    def gauge(name: str, text: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"cairnq_flow_limit_{name}", text, labels=labels)

    running = gauge("running", "Tasks running under the limit now (key prefix: the busiest key).")
    concurrency = gauge("concurrency", "The most that may run at once (key prefix: per key).")
    starts = gauge(
        "starts_in_window", "Starts in the rate's current window (key prefix: the busiest key)."
    )
    rate = gauge("rate", "The most starts per window (key prefix: per key).")
    period = gauge("rate_period_seconds", "The rate's window.")
    held = gauge("held", "Due queued tasks this limit keeps from starting now.")
    full_keys = gauge("keys_at_limit", "Key prefix limits: keys with every slot or start used.")
    for usage in view.limits:
        limit = usage.limit
        values = [limit.scope, limit.value]
        running.add_metric(values, usage.running)
        held.add_metric(values, usage.held)
        if limit.concurrency is not None:
            concurrency.add_metric(values, limit.concurrency)
        if limit.rate is not None and limit.per_ms is not None:
            rate.add_metric(values, limit.rate)
            period.add_metric(values, limit.per_ms / 1000)
            starts.add_metric(values, usage.starts_in_window)
        if limit.scope == "key_prefix":
            full_keys.add_metric(values, usage.keys_at_limit)
    yield from (running, concurrency, starts, rate, period, held, full_keys)


def queue_registry(using: str | None = None) -> CollectorRegistry:
    """A registry holding only the database-side gauges (what views.metrics serves)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(using))
    return registry


# ------------------------------------------------------------ worker side

_LABELS = ["queue", "name"]
STARTED = Counter(
    "cairnq_worker_tasks_started", "Attempts this worker started.", _LABELS, registry=None
)
FINISHED = Counter(
    "cairnq_worker_tasks_finished",
    "Tasks this worker finished, by final status (succeeded, failed, canceled).",
    [*_LABELS, "status"], registry=None,
)
RETRIES = Counter(
    "cairnq_worker_task_retries", "Attempts that failed and were queued again.", _LABELS,
    registry=None,
)
SNOOZES = Counter(
    "cairnq_worker_task_snoozes",
    "Attempts the handler snoozed (queued again later, not counted as a failure).", _LABELS,
    registry=None,
)
LEASE_LOSSES = Counter(
    "cairnq_worker_lease_losses",
    "Attempts that ended without writing because their lease was gone.", _LABELS, registry=None,
)
LATE_HEARTBEATS = Counter(
    "cairnq_worker_heartbeats_late",
    "Heartbeats that ran more than one interval late (leases at risk).", registry=None,
)
DURATION = Histogram(
    "cairnq_worker_task_duration_seconds", "How long each attempt's handler call ran.",
    _LABELS, registry=None,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
WORKER_METRICS = (STARTED, FINISHED, RETRIES, SNOOZES, LEASE_LOSSES, LATE_HEARTBEATS, DURATION)


# The counter each signal that ends an attempt adds one to; FINISHED also by final status.
_COUNTERS = {
    signals.task_succeeded: FINISHED,
    signals.task_failed: FINISHED,
    signals.task_canceled: FINISHED,
    signals.task_retrying: RETRIES,
    signals.task_snoozed: SNOOZES,
    signals.task_lease_lost: LEASE_LOSSES,
}


def on_started(sender: type, task: TaskRecord, **kwargs: Any) -> None:
    STARTED.labels(task.queue, task.name).inc()


def on_ended(sender: type, signal: Signal, task: TaskRecord, duration: float, **kwargs: Any) -> None:
    DURATION.labels(task.queue, task.name).observe(duration)
    counter = _COUNTERS[signal]
    if counter is not FINISHED:
        counter.labels(task.queue, task.name).inc()
    elif task.status in TERMINAL_STATUSES:
        FINISHED.labels(task.queue, task.name, task.status).inc()


def on_heartbeat_late(sender: type, **kwargs: Any) -> None:
    LATE_HEARTBEATS.inc()


_RECEIVERS: tuple[tuple[Signal, Callable[..., None]], ...] = (
    (signals.task_started, on_started),
    *((signal, on_ended) for signal in _COUNTERS),
    (signals.heartbeat_late, on_heartbeat_late),
)


def connect_worker_metrics(registry: CollectorRegistry | None = REGISTRY) -> None:
    """Count this process's tasks into `registry` (idempotent)."""
    for signal, receiver in _RECEIVERS:
        signal.connect(receiver, dispatch_uid=f"cairnq-metrics-{receiver.__name__}")
    if registry is not None:
        for metric in WORKER_METRICS:
            try:
                registry.register(metric)
            except ValueError:
                pass  # registered already


def disconnect_worker_metrics() -> None:
    for signal, receiver in _RECEIVERS:
        signal.disconnect(receiver, dispatch_uid=f"cairnq-metrics-{receiver.__name__}")


def serve_worker_metrics(port: int, addr: str = DEFAULT_METRICS_ADDR) -> int:
    """Count this worker's tasks and serve them on http://addr:port/metrics; return the port.

    prometheus_client's server has no authentication and answers on every
    path, so it listens on the loopback unless the caller widens `addr`.
    """
    connect_worker_metrics()
    started = start_http_server(port, addr=addr)
    server = started[0] if isinstance(started, tuple) else None
    bound = server.server_port if server is not None else port
    logger.info("Serving worker metrics on http://%s:%d/metrics.", addr, bound)
    return bound
