"""StepContext: the context of a workflow step, with its parents' results and a way to graft steps.

The worker builds one instead of a TaskContext only for a claimed row whose
metadata carries the workflow marker. Its store is StepSettling, so every
settling write (completion, failure, snooze, ctx.atomic()) releases the
step's children in the same transaction; such a completion is written
alone, not in the settler's group.
"""

from __future__ import annotations

from typing import Any, cast

from ..store.leases import LeaseOperations
from ..workflows import STEP_KEY
from ..workflows.grafting import graft
from ..workflows.reads import Parents, parent_results
from ..workflows.settling import StepSettling
from .context import TaskContext


class WorkflowHandle:
    """ctx.workflow: the step's workflow, to which a running step may add steps."""

    def __init__(self, ctx: StepContext) -> None:
        self._ctx = ctx

    @property
    def id(self) -> str:
        return str(self._ctx.metadata[STEP_KEY]["workflow"])

    def add(self, name: str, task: Any, payload: Any = None, *, blocks: Any = None,
            **options: Any) -> None:
        """Add a step that runs after this one; `blocks` names steps that must also wait for it.

        Written with this step's completion, and only if it succeeds.
        """
        self._ctx.settling.grafts.append(graft(name, task, payload, blocks=blocks, **options))


class StepContext(TaskContext):
    """A TaskContext whose task is a workflow step."""

    def __init__(self, *, store: LeaseOperations, **kwargs: Any) -> None:
        self.settling = StepSettling(store)
        super().__init__(store=cast(LeaseOperations, self.settling), **kwargs)
        self._parents: Parents | None = None

    @property
    def parents(self) -> Parents:
        """The parents' results by step name (a map()'s as a list), read on first use."""
        if self._parents is None:
            step_id = str(self.metadata[STEP_KEY]["step"])
            self._parents = parent_results(step_id, using=self.settling.using)
        return self._parents

    @property
    def workflow(self) -> WorkflowHandle:
        return WorkflowHandle(self)
