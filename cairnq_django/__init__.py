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

# Name -> the module (under this package) it loads from on first use.
_LAZY = {
    name: module
    for module, names in {
        "client": (
            "PendingTask acall acancel aenqueue aenqueue_many aget aget_by_key aget_task alist_tasks"
            " apurge aretry astats await_task await_task_by_key call cancel enqueue enqueue_many get"
            " get_by_key get_task list list_tasks purge retry stats wait wait_by_key"
        ),
        "worker": "TaskContext register task",
        "flow.pausing": "pause_queue paused_queues resume_queue",
        "flow.limits": "Limit LimitUsage clear_limit effective_limits limit_usage set_limit",
        "workflows.builder": "Workflow",
        "workflows.steps": "InvalidWorkflow",
        "workflows.control": "cancel_workflow retry_workflow",
        "workflows.reads": (
            "WorkflowRun WorkflowTimeout aget_workflow await_workflow get_workflow wait_workflow"
        ),
        "workflows.shorthands": "chain chord group sig",
    }.items()
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    # Django imports this package before its app registry is ready, and the
    # client and the worker reach the models through the store: the names of
    # __all__ that are not defined above load on first use, once the models exist.
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    # `list` mirrors the protocol's operation name. It stays out of
    # __all__ so `from cairnq_django import *` does not shadow the builtin.
    attribute = "list_tasks" if name == "list" else name
    return getattr(import_module(f".{_LAZY[name]}", __name__), attribute)


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
