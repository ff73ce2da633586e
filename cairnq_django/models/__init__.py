"""The app's tables, declared as Django models; Django finds every one of them here.

protocol.py holds the CairnQ protocol's tables (shared with peers in other
languages, at the protocol's schema); the others are the app's own, with
ordinary migrations, and no other CairnQ implementation reads or writes them:
flow control's (flow.py), attempt history (attempts.py), the schedules'
cursors (schedules.py), the workers' presence (workers.py) and the workflows'
runs, steps and edges (workflows.py). Each module imports only the ORM
vocabulary below it (db/, records), so the code that owns a table imports its
model from here and nothing here imports back.
"""

from .attempts import TaskAttempt
from .flow import FlowLimit, FlowStart, QueueState, TaskFlow
from .protocol import PeerMigration, ProtocolMeta, Task, TaskKey
from .schedules import ScheduleState
from .workers import WorkerRecord
from .workflows import Workflow, WorkflowEdge, WorkflowStep

__all__ = [
    "FlowLimit",
    "FlowStart",
    "PeerMigration",
    "ProtocolMeta",
    "QueueState",
    "ScheduleState",
    "Task",
    "TaskAttempt",
    "TaskFlow",
    "TaskKey",
    "WorkerRecord",
    "Workflow",
    "WorkflowEdge",
    "WorkflowStep",
]
