"""Workflow: name steps, say which run after which, enqueue them all in one transaction.

    wf = Workflow("crawl", key=f"crawl:{site.pk}", concurrency=4)
    a = wf.add("crawl", "site.crawl", {"site": site.pk})
    f = wf.map("fetch", "site.fetch", [{"url": u} for u in urls], after=a)
    i = wf.add("index", "site.index", after=f)
    wf.add("notify", "site.notify", after=i, when="finished")
    run = wf.enqueue()

add() and map() only record; enqueue() checks the whole graph (names,
cycles, JSON payloads, options, size) before it writes anything, then writes
the workflow, its steps and edges and the tasks of its first steps in the
caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from graphlib import CycleError, TopologicalSorter
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import validators
from ..ids import ulid
from ..jsoncodec import dumps
from ..models import Workflow as WorkflowRow
from ..models import WorkflowEdge, WorkflowStep
from ..models.workflows import WHEN_CHOICES
from ..records import TaskSpec
from ..store import ApplicationOperations, get_store
from ..validators import MAX_KEY_LENGTH, MAX_NAME_LENGTH, check_label
from .reads import WorkflowRun
from .steps import CONCURRENCY_PREFIX, InvalidWorkflow, prepare_step, task_name, task_spec

# The most steps one enqueue() writes: a graph this size is written in one
# transaction, and a larger one is more likely a mistake than a plan.
MAX_STEPS = 20_000

# enqueue()'s options a step takes, stored on the step until its task row is written.
_STEP_OPTIONS = frozenset({"queue", "priority", "max_attempts", "delay", "concurrency_key"})


@dataclass(frozen=True)
class Steps:
    """What add() and map() return: a name to put in another step's `after=`."""

    group: str
    names: tuple[str, ...]


@dataclass
class _Planned:
    name: str
    group: str
    index: int | None
    task: str
    payload: Any
    after: list[Any]
    when: str
    options: dict[str, Any] = field(default_factory=dict)
    # The options as the task row takes them (delay as delay_ms), set by the checks.
    resolved: dict[str, Any] = field(default_factory=dict)


class Workflow:
    """A graph of steps to enqueue together; see the module docstring."""

    def __init__(self, name: str, *, key: str | None = None, concurrency: int | None = None) -> None:
        check_label("Workflow name", name, MAX_NAME_LENGTH)
        check_label("key", key, MAX_KEY_LENGTH, optional=True)
        if concurrency is not None:
            validators.check_int32("concurrency", concurrency, minimum=1)
        self.name = name
        self.key = key
        self.concurrency = concurrency
        self._steps: list[_Planned] = []

    def add(
        self, name: str, task: Any, payload: Any = None, *, after: Any = None,
        when: str = "succeeded", **options: Any,
    ) -> Steps:
        """Add one step; it runs after every step in `after` (names or what add/map returned)."""
        self._steps.append(_Planned(name, name, None, task, payload, _as_list(after), when, options))
        return Steps(name, (name,))

    def map(
        self, name: str, task: Any, payloads: Iterable[Any], *, after: Any = None,
        when: str = "succeeded", **options: Any,
    ) -> Steps:
        """Add one step per payload ("name[0]", "name[1]", ...): a fan-out; after=it is the fan-in."""
        after_list = _as_list(after)
        names = []
        for index, payload in enumerate(payloads):
            step = f"{name}[{index}]"
            names.append(step)
            self._steps.append(_Planned(step, name, index, task, payload, after_list, when, options))
        return Steps(name, tuple(names))

    def enqueue(self, *, using: str | None = None) -> Any:
        """Check the graph, then write it and its first tasks in the caller's transaction; return the run.

        With a key, a workflow of that key still running is returned instead.
        """

        store = get_store(using)
        steps, parents = self._checked(store)
        with transaction.atomic(using=store.using, savepoint=False):
            if self.key is not None:
                store.lock_key("cairnq.workflow:" + self.key)
                running = WorkflowRow.objects.using(store.using).filter(
                    key=self.key, state="running"
                ).order_by("-created_at_ms").first()
                if running is not None:
                    return WorkflowRun.load(running.pk, using=store.using)
            workflow_id = self._write(store, steps, parents)
        return WorkflowRun.load(workflow_id, using=store.using)

    # ------------------------------------------------------------ checks
    def _checked(self, store: ApplicationOperations) -> tuple[list[_Planned], dict[str, list[str]]]:
        """Every step checked, and each step's parents by name; InvalidWorkflow before any write."""
        steps = self._steps
        if not steps:
            raise InvalidWorkflow(f"Workflow {self.name!r} has no steps.")
        if len(steps) > MAX_STEPS:
            raise InvalidWorkflow(
                f"Workflow {self.name!r} has {len(steps)} steps; one enqueue() takes at most {MAX_STEPS}."
            )
        groups: dict[str, list[str]] = {}
        seen: set[str] = set()
        for step in steps:
            if step.name in seen or (step.index in (None, 0) and step.group in groups):
                duplicate = step.name if step.name in seen else step.group
                raise InvalidWorkflow(f"Workflow {self.name!r} has two steps named {duplicate!r}.")
            seen.add(step.name)
            groups.setdefault(step.group, []).append(step.name)
        parents: dict[str, list[str]] = {}
        for step in steps:
            self._check_step(store, step)
            names: list[str] = []
            for ref in step.after:
                group = ref.group if isinstance(ref, Steps) else ref
                if not isinstance(group, str) or group not in groups:
                    raise InvalidWorkflow(
                        f"Step {step.name!r} of workflow {self.name!r} runs after {group!r}, "
                        f"which is not a step of this workflow."
                    )
                names += groups[group]
            parents[step.name] = list(dict.fromkeys(names))
        _check_acyclic(self.name, parents)
        return steps, parents

    def _check_step(self, store: ApplicationOperations, step: _Planned) -> None:
        where = f"step {step.name!r} of workflow {self.name!r}"
        check_label("Step name", step.name, MAX_NAME_LENGTH)
        if step.when not in WHEN_CHOICES:
            raise InvalidWorkflow(
                f"when= of {where} must be one of {', '.join(WHEN_CHOICES)}, got {step.when!r}."
            )
        unknown = sorted(set(step.options) - _STEP_OPTIONS)
        if unknown:
            hint = " (give the workflow a key= instead)" if "key" in unknown else ""
            raise InvalidWorkflow(f"{where.capitalize()} got unknown options: {', '.join(unknown)}{hint}.")
        step.task = task_name(step.task)
        dumps({} if step.payload is None else step.payload, what=f"payload of {where}")
        options = step.resolved = dict(step.options)
        delay_ms = validators.delay_ms(options.pop("delay", None), None, timezone.now())
        if delay_ms:
            options["delay_ms"] = delay_ms
        # prepare() runs the enqueue checks (name, key, queue, priority, max_attempts), writing nothing.
        prepare_step(store, step.task, step.payload, options)

    # ------------------------------------------------------------ writing
    def _write(
        self, store: ApplicationOperations, steps: list[_Planned], parents: dict[str, list[str]]
    ) -> str:
        using = store.using
        workflow_id = "wf_" + ulid()
        WorkflowRow.objects.using(using).create(
            id=workflow_id, name=self.name, key=self.key, concurrency=self.concurrency,
            steps_total=len(steps), steps_open=len(steps), created_at_ms=store.clock_ms(),
        )
        if self.concurrency is not None:
            from ..flow.limits import set_limit

            set_limit("key_prefix", CONCURRENCY_PREFIX + workflow_id, concurrency=self.concurrency,
                      using=using, by=f"workflow {workflow_id}")
        rows = [
            WorkflowStep(
                id="wfs_" + ulid(), position=position, workflow_id=workflow_id, name=s.name,
                group=s.group, index=s.index,
                task_name=s.task, payload={} if s.payload is None else s.payload,
                options=self._options(workflow_id, s), when=s.when, pending=len(parents[s.name]),
            )
            for position, s in enumerate(steps)
        ]
        # The first steps go in released, their task rows beside them: no second write per step.
        specs: list[TaskSpec] = []
        for row in rows:
            if row.pending == 0:
                spec = task_spec(store, row)
                row.task_id, row.state = spec["id"], "released"
                specs.append(spec)
        WorkflowStep.objects.using(using).bulk_create(rows, batch_size=1000)
        by_name = {row.name: row for row in rows}
        edges = [
            WorkflowEdge(workflow_id=workflow_id, parent_id=by_name[parent].pk, child_id=by_name[child].pk)
            for child, names in parents.items() for parent in names
        ]
        WorkflowEdge.objects.using(using).bulk_create(edges, batch_size=1000)
        store.submit_many(specs)
        return workflow_id

    def _options(self, workflow_id: str, step: _Planned) -> dict[str, Any]:
        options = dict(step.resolved)
        if self.concurrency is not None:
            # A step's own concurrency key wins: a task has one.
            options.setdefault("concurrency_key", CONCURRENCY_PREFIX + workflow_id)
        return options


def _as_list(after: Any) -> list[Any]:
    if after is None:
        return []
    if isinstance(after, (str, Steps)):
        return [after]
    if isinstance(after, Sequence):
        return list(after)
    raise InvalidWorkflow(
        f"after= takes a step name, what add() or map() returned, or a list of them; got {after!r}."
    )


def _check_acyclic(workflow: str, parents: dict[str, list[str]]) -> None:
    """Raise InvalidWorkflow naming the steps of a cycle."""
    try:
        TopologicalSorter(parents).prepare()
    except CycleError as exc:
        stuck = sorted(set(exc.args[1]))
        raise InvalidWorkflow(
            f"Workflow {workflow!r} has a cycle: steps {', '.join(map(repr, stuck[:5]))} wait on each other."
        ) from None
