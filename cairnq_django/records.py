"""Plain values the store hands back: a task row and a status probe."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from . import jsoncodec

# What a peer reads from cairnq_meta before it uses the tables.
PROTOCOL_VERSION = 1
SCHEMA_VERSION = 10
# The protocol's notification channels (PostgreSQL): its trigger notifies
# QUEUED_CHANNEL with the queue's name on every enqueue, DONE_CHANNEL with the
# task's id when it finishes.
QUEUED_CHANNEL = "cairnq_queued"
DONE_CHANNEL = "cairnq_done"

STATUSES = ("queued", "running", "succeeded", "failed", "canceled")
TERMINAL_STATUSES = ("succeeded", "failed", "canceled")
LIVE_STATUSES = ("queued", "running")
# What retry() may queue again.
RETRYABLE_STATUSES = ("failed", "canceled")
CONFLICTS = ("reuse", "reuse-succeeded", "reject", "replace")

# The protocol's defaults, shared by every signature that offers them.
DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_PRIORITY = 0
DEFAULT_LEASE_MS = 30000
DEFAULT_CONFLICT = "reuse"

JSON_COLUMNS = ("payload", "result", "error", "metadata")
COLUMNS = (
    "id",
    "name",
    "queue",
    "status",
    "payload",
    "result",
    "error",
    "metadata",
    "progress",
    "message",
    "attempt",
    "max_attempts",
    "priority",
    "worker_id",
    "lease_until_ms",
    "run_at_ms",
    "cancel_requested_at_ms",
    "parent_id",
    "root_id",
    "correlation_id",
    "created_at_ms",
    "updated_at_ms",
    "completed_at_ms",
)


class TaskSpec(TypedDict):
    """One task validated and encoded for its INSERT (the store's `prepare`), not written yet."""

    id: str
    name: str
    queue: str
    payload: str  # JSON text, encoded once by jsoncodec
    metadata: str  # JSON text
    max_attempts: int
    priority: int
    delay_ms: int  # run_at_ms is the insert's clock plus this
    parent_id: str | None
    root_id: str
    correlation_id: str | None
    # Not a protocol column: models.TaskFlow's, written with the task.
    concurrency_key: str | None


def is_terminal(status: str) -> bool:
    return status in TERMINAL_STATUSES


def attempt_label(attempt: int, max_attempts: int) -> str:
    """"2/3": attempt 2 of the 3 max_attempts allows.

    A manual retry that keeps the count (the admin's "Retry", retry() without
    reset_attempt) runs one attempt past max_attempts; "4/3" would read as a
    bug, so such an attempt says what it is: "4 (max 3, retried by hand)".
    Its failure is final, as no automatic retry is left.
    """
    if attempt <= max_attempts:
        return f"{attempt}/{max_attempts}"
    return f"{attempt} (max {max_attempts}, retried by hand)"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRecord:
    """One cairnq_tasks row, every column under its protocol name, JSON decoded."""

    id: str
    name: str
    queue: str
    status: str
    payload: Any
    result: Any
    error: Any
    metadata: Any
    progress: float | None
    message: str | None
    attempt: int
    max_attempts: int
    priority: int
    worker_id: str | None
    lease_until_ms: int | None
    run_at_ms: int
    cancel_requested_at_ms: int | None
    parent_id: str | None
    root_id: str | None
    correlation_id: str | None
    created_at_ms: int
    updated_at_ms: int
    completed_at_ms: int | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TaskRecord:
        values = {column: row[column] for column in COLUMNS}
        for column in JSON_COLUMNS:
            values[column] = jsoncodec.loads(values[column])
        values["message"] = jsoncodec.decodes_text(values["message"])
        if values["progress"] is not None:
            values["progress"] = float(values["progress"])
        return cls(**values)

    @classmethod
    def from_sequence(cls, row: Sequence[Any]) -> TaskRecord:
        """`from_row` for the columns in COLUMNS order, as a cursor returns them.

        Two of these per task (its claim and its completion): the values go
        straight into the slots, where a frozen dataclass's __init__ would
        pass each one through object.__setattr__ (a third of the cost).
        """
        values = list(row)
        if len(values) != len(COLUMNS):
            raise ValueError(f"a task row has {len(COLUMNS)} columns, not {len(values)}")
        for index in _JSON_INDEXES:
            values[index] = jsoncodec.loads(values[index])
        values[_MESSAGE_INDEX] = jsoncodec.decodes_text(values[_MESSAGE_INDEX])
        if values[_PROGRESS_INDEX] is not None:
            values[_PROGRESS_INDEX] = float(values[_PROGRESS_INDEX])
        record = object.__new__(TaskRecord if cls is TaskRecord else cls)
        for set_slot, value in zip(_SLOT_SETTERS, values, strict=True):
            set_slot(record, value)
        return record

    @property
    def is_terminal(self) -> bool:
        return is_terminal(self.status)

    @property
    def undecodable(self) -> dict[str, jsoncodec.Undecodable]:
        """The JSON columns this process could not decode, by column name."""
        return {
            column: value
            for column in JSON_COLUMNS
            if isinstance(value := getattr(self, column), jsoncodec.Undecodable)
        }

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at_ms is not None

    def as_dict(self) -> dict[str, Any]:
        return {column: getattr(self, column) for column in COLUMNS}


_JSON_INDEXES = tuple(COLUMNS.index(column) for column in JSON_COLUMNS)
_MESSAGE_INDEX = COLUMNS.index("message")
_PROGRESS_INDEX = COLUMNS.index("progress")
# The slots' own descriptors, in COLUMNS order (every field is a column).
_SLOT_SETTERS = tuple(getattr(TaskRecord, column).__set__ for column in COLUMNS)
assert tuple(TaskRecord.__slots__) == COLUMNS  # noqa: S101 - from_sequence relies on it


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStatus:
    """The wait loop's probe: a task's id and status, nothing else."""

    id: str
    status: str

    @property
    def is_terminal(self) -> bool:
        return is_terminal(self.status)


# A flow limit's value and a concurrency key are index entries and names a
# person reads; the same bound as a queue's or a task name's.
MAX_LIMIT_VALUE_LENGTH = 255
# A schedule's name is its state row's primary key.
MAX_SCHEDULE_NAME_LENGTH = 200
# What room() says of a lifted limit: more than any column could count.
_NO_BOUND = 2**31 - 1


@dataclass(frozen=True)
class Limit:
    """One fleet-wide limit: at most `concurrency` running at once, `rate` starts per `per_ms`.

    `scope` is "queue", "name" or "key_prefix", and `value` the queue, the
    task name or the concurrency-key prefix it applies to. `source` says
    where it comes from: "settings" (CAIRNQ["LIMITS"]) or "runtime" (a row
    written by set_limit, which overrides the settings' limit on the same
    scope and value). A runtime limit with neither concurrency nor rate
    lifts the settings' one.
    """

    scope: str
    value: str
    concurrency: int | None
    rate: int | None
    per_ms: int | None
    source: str

    @property
    def is_lifted(self) -> bool:
        """Neither a concurrency nor a rate: nothing is limited."""
        return self.concurrency is None and self.rate is None

    def applies_to(self, *, queue: str, name: str, concurrency_key: str | None) -> bool:
        if self.scope == "queue":
            return queue == self.value
        if self.scope == "name":
            return name == self.value
        return concurrency_key is not None and concurrency_key.startswith(self.value)

    def room(self, running: int, starts: int) -> int:
        """How many more may start now, with `running` holding slots and `starts` in the window.

        Zero or less: full (negative: over, after the limit was lowered). The
        limited claim and the usage report both judge fullness by this.
        """
        room = []
        if self.concurrency is not None:
            room.append(self.concurrency - running)
        if self.rate is not None:
            room.append(self.rate - starts)
        return min(room, default=_NO_BOUND)

    def describe(self) -> str:
        """"name 'reports.generate': 3 running, 20 per 1000 ms" (logs, messages)."""
        what = "key prefix" if self.scope == "key_prefix" else self.scope
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} running" + (" per key" if self.scope == "key_prefix" else ""))
        if self.rate is not None:
            parts.append(f"{self.rate} per {self.per_ms} ms")
        return f"{what} {self.value!r}: {', '.join(parts) or 'no limit'}"
