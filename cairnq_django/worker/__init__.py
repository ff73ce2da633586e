"""The worker: handler registry, task context and the loop that runs them."""

from .context import TaskContext
from .options import WorkerOptions, WorkerOverrides
from .registry import Registration, Registry, autodiscover, register, registry, task
from .runner import Worker

__all__ = [
    "Registration",
    "Registry",
    "TaskContext",
    "Worker",
    "WorkerOptions",
    "WorkerOverrides",
    "autodiscover",
    "register",
    "registry",
    "task",
]
