"""What operators see: live workers, queue health, metrics and traces.

One module per concern: `models` (the workers table), `presence` (a worker
recording itself there), `overview` (the queue and workers summary that the
commands, the health check, the metrics and the admin dashboard share),
`health` (cairnq_health's rules), `metrics` and `views` (Prometheus, optional),
`tracing` (OpenTelemetry, optional). Metrics and tracing are receivers of
cairnq_django.signals; nothing here is woven through the worker.
"""

# Where `cairnq_worker --metrics-port` listens unless --metrics-addr says
# otherwise: prometheus_client's server has no authentication, so this host only.
DEFAULT_METRICS_ADDR = "127.0.0.1"
