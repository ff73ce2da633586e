"""What operators see: live workers, queue health, metrics and traces.

Each module is one concern: `models` (the workers table), `presence` (a
worker recording itself there), `overview` (the queue and workers summary the
commands, the health check and the dashboard share), `metrics` (Prometheus,
optional), `tracing` (OpenTelemetry, optional). Metrics and tracing are
receivers of cairnq_django.signals; nothing here is woven through the worker.
"""
