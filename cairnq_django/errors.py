"""The exceptions cairnq_django raises, named as the CairnQ protocol names them."""

from __future__ import annotations

from typing import Any

from .delays import snooze_delay_ms


class CairnQError(Exception):
    """Base class of every error this package raises on purpose."""


class AlreadyExists(CairnQError):
    """A keyed submit with conflict="reject" found the key already taken."""

    def __init__(self, key: str) -> None:
        super().__init__(f"A task with key {key!r} already exists.")
        self.key = key


class LostLease(CairnQError):
    """A worker write found the task no longer held by this worker's lease."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"Task {task_id} is no longer held by this worker: its lease expired, "
            "it was recovered by another worker, or it already finished."
        )
        self.task_id = task_id


class HeartbeatLate(CairnQError):
    """A worker's heartbeat ran more than one interval late; leases were at risk.

    Not raised: the worker passes it to the ON_ERROR hook (phase "execute").
    `cause` says where the time went: "cpu" when the beat itself started late
    (something held the GIL or starved the process of CPU), "database" when
    the previous renewal statement took that long (a row lock, a slow or
    broken network, an overloaded server). `renewal_ms` is how long that
    renewal took, `started_late_ms` how late the beat woke up after it. A beat
    later than the lease lets another worker run the tasks in `task_ids` again.
    """

    def __init__(
        self, *, late_ms: int, interval_ms: int, lease_ms: int, task_ids: list[str],
        cause: str = "cpu", renewal_ms: int = 0, started_late_ms: int | None = None,
    ) -> None:
        where = (
            f"the previous renewal took {renewal_ms} ms in the database or network"
            if cause == "database"
            else "the beat started late (CPU or GIL)"
        )
        super().__init__(
            f"The heartbeat ran {late_ms} ms late (interval {interval_ms} ms, lease "
            f"{lease_ms} ms; {where}); "
            + (
                "the lease of 1 in-flight task was at risk."
                if len(task_ids) == 1
                else f"the leases of {len(task_ids)} in-flight tasks were at risk."
            )
        )
        self.late_ms = late_ms
        self.interval_ms = interval_ms
        self.lease_ms = lease_ms
        self.task_ids = list(task_ids)
        self.cause = cause
        self.renewal_ms = renewal_ms
        self.started_late_ms = late_ms if started_late_ms is None else started_late_ms


class SerializationError(CairnQError, ValueError):
    """A value cannot cross the protocol boundary as strict JSON."""


class QueueFull(CairnQError):
    """The queue stayed at its configured depth limit for the whole wait."""

    def __init__(self, queue: str, max_depth: int, waited_ms: int) -> None:
        super().__init__(
            f"Queue {queue!r} held {max_depth} queued tasks (MAX_QUEUE_DEPTH) for "
            f"{waited_ms} ms; the task was not enqueued. Add workers, raise the limit, "
            "or retry later."
        )
        self.queue = queue
        self.max_depth = max_depth
        self.waited_ms = waited_ms


class TaskTimeout(CairnQError, TimeoutError):
    """wait()/call() gave up; the task itself keeps going.

    `task_id` is the handle to wait again with: the waited task's id, or for
    wait_by_key() the task the key pointed at, or the key itself when it
    pointed at nothing (there was no id to report; the protocol's SDKs do the
    same). `key` is the key for a wait by key, else None. `snapshot` is the
    last row read, or None when there was none or the database was unreachable
    at the end (the message then says so).
    """

    def __init__(
        self,
        message: str,
        *,
        task_id: str,
        key: str | None = None,
        snapshot: Any = None,
    ) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.key = key
        self.snapshot = snapshot


class TaskFailed(CairnQError):
    """A waited-on task ended failed; carries its error envelope."""

    def __init__(self, task: Any) -> None:
        error = task.error if isinstance(task.error, dict) else {}
        self.task = task
        self.task_id = task.id
        self.code = error.get("code")
        self.retryable = bool(error.get("retryable", False))
        self.error = error
        super().__init__(f"Task {task.id} ({task.name}) failed: {error.get('message', error)}")


class TaskCanceled(CairnQError):
    """A waited-on task ended canceled."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.task_id = task.id
        super().__init__(f"Task {task.id} ({task.name}) was canceled.")


class ProtocolVersionMismatch(CairnQError):
    """The database speaks a CairnQ protocol major this package does not."""


class TablesMissing(CairnQError):
    """The queue's database lacks CairnQ tables: `migrate` has not run there (or not fully)."""

    def __init__(self, using: str, tables: list[str]) -> None:
        which = (
            f"table {tables[0]} is" if len(tables) == 1 else f"tables {', '.join(tables)} are"
        )
        super().__init__(
            f"The CairnQ {which} missing from database {using!r}; create "
            f"{'it' if len(tables) == 1 else 'them'} with "
            f"`manage.py migrate cairnq_django --database {using}`."
        )
        self.using = using
        self.tables = list(tables)


class TaskError(CairnQError):
    """Raised by a handler to fail its task with a chosen error envelope."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = details or {}


class Snooze(CairnQError):
    """Raised by a handler to run its task again after `delay` seconds (or a timedelta).

    The task goes back to the queue due then, with this attempt given back
    (it does not count against max_attempts) and no error recorded; see
    TaskContext.snooze. A bad delay raises ValueError here, where the handler
    made the mistake, and the task then fails like any handler exception.
    """

    def __init__(self, delay: Any) -> None:
        self.delay_ms = snooze_delay_ms(delay)
        self.delay = delay
        super().__init__(f"Snoozed for {self.delay_ms} ms.")


def error_envelope(
    *,
    type: str,  # noqa: A002 - the envelope's field; keyword-only, so the builtin is not needed here
    code: str,
    message: str,
    retryable: bool,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the protocol's JSON error envelope."""
    return {
        "type": type,
        "code": code,
        "message": message,
        "retryable": retryable,
        "details": details or {},
    }
