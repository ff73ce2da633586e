"""cairnq_django: a durable, database-backed task queue for Django (CairnQ protocol)."""

from typing import TYPE_CHECKING, Any

from .errors import (
    AlreadyExists,
    CairnQError,
    HeartbeatLate,
    LostLease,
    ProtocolVersionMismatch,
    QueueFull,
    SerializationError,
    Snooze,
    TablesMissing,
    TaskCanceled,
    TaskError,
    TaskFailed,
    TaskTimeout,
)
from .records import TaskRecord, TaskStatus

if TYPE_CHECKING:
    from .client import (
        PendingTask,
        acall,
        acancel,
        aenqueue,
        aenqueue_many,
        aget,
        aget_by_key,
        aget_task,
        alist_tasks,
        apurge,
        aretry,
        astats,
        await_task,
        await_task_by_key,
        call,
        cancel,
        enqueue,
        enqueue_many,
        get,
        get_by_key,
        get_task,
        list_tasks,
        purge,
        retry,
        stats,
        wait,
        wait_by_key,
    )

    # For type checkers only (kept out of __all__: it would shadow the builtin on import *).
    from .client import list_tasks as list  # noqa: A004, F401
    from .flow.limits import Limit, LimitUsage, clear_limit, effective_limits, limit_usage, set_limit
    from .flow.pausing import pause_queue, paused_queues, resume_queue
    from .worker import TaskContext, register, task
    from .workflows.builder import Workflow
    from .workflows.control import cancel_workflow, retry_workflow
    from .workflows.reads import (
        WorkflowRun,
        WorkflowTimeout,
        aget_workflow,
        await_workflow,
        get_workflow,
        wait_workflow,
    )
    from .workflows.shorthands import chain, chord, group, sig
    from .workflows.steps import InvalidWorkflow

_WORKER_NAMES = frozenset({"TaskContext", "register", "task"})
_FLOW_NAMES = frozenset({"pause_queue", "paused_queues", "resume_queue"})
_LIMIT_NAMES = frozenset(
    {"Limit", "LimitUsage", "clear_limit", "effective_limits", "limit_usage", "set_limit"}
)

_WORKFLOW_NAMES = {
    "Workflow": "builder", "InvalidWorkflow": "steps", "cancel_workflow": "control",
    "retry_workflow": "control", "WorkflowRun": "reads", "WorkflowTimeout": "reads",
    "aget_workflow": "reads", "await_workflow": "reads", "get_workflow": "reads",
    "wait_workflow": "reads", "chain": "shorthands", "chord": "shorthands", "group": "shorthands",
    "sig": "shorthands",
}


def __getattr__(name: str) -> Any:
    # Django imports this package before its app registry is ready, and the
    # client and the worker reach the models through the store: the names of
    # __all__ that are not defined above load on first use, once the models exist.
    if name in _WORKFLOW_NAMES:
        from importlib import import_module

        return getattr(import_module(f".workflows.{_WORKFLOW_NAMES[name]}", __name__), name)
    if name in _WORKER_NAMES:
        from . import worker

        return getattr(worker, name)
    if name in _FLOW_NAMES:
        from .flow import pausing

        return getattr(pausing, name)
    if name in _LIMIT_NAMES:
        from .flow import limits

        return getattr(limits, name)
    if name in __all__ or name == "list":
        from . import client

        # `list` mirrors the protocol's operation name. It stays out of
        # __all__ so `from cairnq_django import *` does not shadow the builtin.
        return getattr(client, "list_tasks" if name == "list" else name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AlreadyExists",
    "CairnQError",
    "HeartbeatLate",
    "InvalidWorkflow",
    "Limit",
    "LimitUsage",
    "LostLease",
    "PendingTask",
    "ProtocolVersionMismatch",
    "QueueFull",
    "SerializationError",
    "Snooze",
    "TablesMissing",
    "TaskCanceled",
    "TaskContext",
    "TaskError",
    "TaskFailed",
    "TaskRecord",
    "TaskStatus",
    "TaskTimeout",
    "Workflow",
    "WorkflowRun",
    "WorkflowTimeout",
    "acall",
    "acancel",
    "aenqueue",
    "aenqueue_many",
    "aget",
    "aget_by_key",
    "aget_task",
    "aget_workflow",
    "alist_tasks",
    "apurge",
    "aretry",
    "astats",
    "await_task",
    "await_task_by_key",
    "await_workflow",
    "call",
    "cancel",
    "cancel_workflow",
    "chain",
    "chord",
    "clear_limit",
    "effective_limits",
    "enqueue",
    "enqueue_many",
    "get",
    "get_by_key",
    "get_task",
    "get_workflow",
    "group",
    "limit_usage",
    "list_tasks",
    "pause_queue",
    "paused_queues",
    "purge",
    "register",
    "resume_queue",
    "retry",
    "retry_workflow",
    "set_limit",
    "sig",
    "stats",
    "task",
    "wait",
    "wait_by_key",
    "wait_workflow",
]
