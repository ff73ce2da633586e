"""The worker's hook: a step's settling write and its children's release in ONE transaction.

A worker settles through StepSettling only for a task whose claimed row
carries the workflow marker (STEP_KEY in its metadata), so a plain task's
settle, and its group commit, are what they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..records import TaskRecord
from ..store.leases import LeaseOperations
from .release import after_settle


class StepSettling(LeaseOperations):
    """The lease part (`store`'s alias and engine); complete/succeed/fail/snooze also release children."""

    def __init__(self, store: LeaseOperations) -> None:
        super().__init__(store.using, lambda _: store.engine)
        #: Steps the handler grafted (ctx.workflow.add), written if the step succeeds.
        self.grafts: list[dict[str, Any]] = []

    def _settle(self, write: Callable[..., TaskRecord], *args: Any, **kwargs: Any) -> TaskRecord:
        with self.atomic():
            row = write(*args, **kwargs)
            after_settle(self, row, self.grafts)
        return row

    def complete(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        return self._settle(super().complete, task_id, worker_id, result)

    def succeed(self, task_id: str, worker_id: str, result: Any = None) -> TaskRecord:
        return self._settle(super().succeed, task_id, worker_id, result)

    def fail(self, *args: Any, **kwargs: Any) -> TaskRecord:
        return self._settle(super().fail, *args, **kwargs)

    def snooze(self, task_id: str, worker_id: str, delay_ms: int, **kwargs: Any) -> TaskRecord:
        # A snooze with a cancel pending ends the step canceled.
        return self._settle(super().snooze, task_id, worker_id, delay_ms, **kwargs)
