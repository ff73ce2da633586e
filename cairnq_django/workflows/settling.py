"""The worker's hook: a step's settling write and its children's release in ONE transaction.

A worker wraps its store in StepSettling only for a task whose claimed row
carries the workflow marker (STEP_KEY in its metadata), so a plain task's
settle, and its group commit, are what they were.
"""

from __future__ import annotations

from typing import Any

from ..records import TaskRecord
from ..store.leases import LeaseOperations
from .release import after_settle


class StepSettling:
    """The lease part; its complete/succeed/fail/snooze also release the step's children."""

    def __init__(self, store: LeaseOperations) -> None:
        self._store = store
        #: Steps the handler grafted (ctx.workflow.add), written if the step succeeds.
        self.grafts: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def _settle(self, method: str, *args: Any, **kwargs: Any) -> TaskRecord:
        with self._store.atomic():
            row: TaskRecord = getattr(self._store, method)(*args, **kwargs)
            after_settle(self._store, row, self.grafts)
        return row

    def complete(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        return self._settle("complete", task_id, worker_id, result)

    def succeed(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        return self._settle("succeed", task_id, worker_id, result)

    def fail(self, *args: Any, **kwargs: Any) -> TaskRecord:
        return self._settle("fail", *args, **kwargs)

    def snooze(self, task_id: str, worker_id: str, delay_ms: int, **kwargs: Any) -> TaskRecord:
        # A snooze with a cancel pending ends the step canceled.
        return self._settle("snooze", task_id, worker_id, delay_ms, **kwargs)
