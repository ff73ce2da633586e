"""Django signals the worker sends as tasks run, for metrics and auditing.

Every signal is sent with `sender` = the Worker class and these keyword
arguments: `worker` (the Worker instance), `task` (a TaskRecord: as claimed for
task_started, as written by the settling statement otherwise), and `duration`
(seconds the attempt ran; absent from task_started). task_failed and
task_retrying also carry `error` (the JSON error envelope); task_retrying
carries `delay_ms` (its backoff). Receivers run on the worker's threads; an
exception in a receiver is logged and never affects the task.

task_lease_lost is sent (with `task` as claimed and `duration`) when an attempt
ends without writing its outcome because the lease was gone: another worker
recovered the task or it was finished elsewhere. heartbeat_late is sent with
`worker` and `error` (a HeartbeatLate) when a heartbeat ran more than one
interval late.

cairnq_django.observability.metrics and .tracing are receivers of these.
"""

from django.dispatch import Signal

task_started = Signal()
task_succeeded = Signal()
task_failed = Signal()
task_retrying = Signal()
task_canceled = Signal()
task_lease_lost = Signal()
heartbeat_late = Signal()
