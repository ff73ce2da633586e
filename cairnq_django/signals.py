"""Django signals the worker sends as tasks run, for metrics and auditing.

Every signal is sent with `sender` = the Worker class and these keyword
arguments: `worker` (the Worker instance), `task` (a TaskRecord: as claimed for
task_started, as written by the settling statement otherwise), and `duration`
(seconds the attempt ran; absent from task_started). task_failed and
task_retrying also carry `error` (the JSON error envelope); task_retrying
carries `delay_ms` (its backoff). Receivers run on the worker's threads; an
exception in a receiver is logged and never affects the task.

task_snoozed is sent (with `task` as written: queued, its attempt given back,
`duration`, and `delay_ms`) when the handler snoozed the task (ctx.snooze() or
raising Snooze). A snooze is not a failure, so neither task_failed nor
task_retrying is sent for it; a snooze that met a pending cancel sends
task_canceled.

task_lease_lost is sent (with `task` as claimed and `duration`) when an attempt
ends without writing its outcome because the lease was gone: another worker
recovered the task or it was finished elsewhere. heartbeat_late is sent with
`worker` and `error` (a HeartbeatLate) when a heartbeat ran more than one
interval late.

Two more are sent where tasks are enqueued (enqueue(), enqueue_many(),
ctx.submit()), on the caller's thread, with `sender` = None. task_enqueuing
comes before the row is written, with `name`, `queue`, `metadata` (the dict
that will be stored: a receiver may add keys to it, as tracing adds
`traceparent`) and `parent` (the submitting task's TaskRecord for ctx.submit(),
else None). task_enqueued follows with the same `metadata` dict, `task` (the
TaskRecord written or reused; for on_commit=True the PendingTask, sent when
the write is deferred) and `error` (the exception if the write raised, else
None). An exception in these receivers is logged and never affects the enqueue.

cairnq_django.observability.metrics and .tracing are receivers of these.

task_written is sent by the store right after every submit (enqueue,
enqueue_many, ctx.submit, a schedule's occurrence, a workflow's steps), on the
writer's thread, with `sender` = None, `using` (the alias) and `rows` (the
TaskRecords written or reused), and only while someone listens; a receiver's
exception reaches the writer. The rows may still roll back with the caller's
transaction. `testing`'s inline mode listens to it.
"""

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("cairnq_django")

task_started = Signal()
task_succeeded = Signal()
task_failed = Signal()
task_retrying = Signal()
task_snoozed = Signal()
task_canceled = Signal()
task_lease_lost = Signal()
heartbeat_late = Signal()
task_enqueuing = Signal()
task_enqueued = Signal()
task_written = Signal()


def send_while_handling(send: Any, raised: BaseException | None) -> None:
    """Call `send()` inside an except block for `raised`, when there is one.

    The Tasks framework's own task_finished receiver logs a failure with
    sys.exc_info(), as its own backends send the signal from their exception
    handler; sent from anywhere else, its ERROR line would carry no exception.
    """
    if raised is None:
        send()
        return
    try:
        raise raised
    except BaseException:
        send()


def enqueuing(name: str, queue: str, metadata: Any, parent: Any = None) -> tuple[Any, bool]:
    """Send task_enqueuing if anyone listens; return (metadata to store, whether it was sent).

    The receivers get a copy of the caller's metadata, so what they add never
    changes the caller's dict. Metadata that is not a dict is left for the
    store to refuse.
    """
    if not task_enqueuing.receivers or not (metadata is None or isinstance(metadata, dict)):
        return metadata, False
    metadata = dict(metadata or {})
    _send(task_enqueuing, name=name, queue=queue, metadata=metadata, parent=parent)
    return metadata, True


def enqueued(metadata: Any, task: Any = None, error: BaseException | None = None) -> None:
    """Send task_enqueued, the pair of a task_enqueuing that was sent."""
    _send(task_enqueued, metadata=metadata, task=task, error=error)


def _send(signal: Signal, **kwargs: Any) -> None:
    for receiver, response in signal.send_robust(sender=None, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "A receiver of a cairnq_django signal (%r) raised; the enqueue is unaffected.",
                receiver, exc_info=response,
            )
