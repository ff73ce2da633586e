"""Run CairnQ conformance scenarios against the lease part: loading, the ops, the steps.

A scenario is JSON data: a list of steps, each one store operation or a
control step (sleep, expect), with assertions on what came back. The runner
is strict on purpose: an unknown op, argument, step key or assertion, or a
reference to nothing, fails the scenario instead of being skipped, because a
check that silently does nothing is how a conformance suite stops meaning
anything.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records import (
    DEFAULT_CONFLICT,
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    TaskRecord,
)
from .assertions import ASSERTIONS, StepFailed, check, describe, resolve

if TYPE_CHECKING:
    from ..store.leases import LeaseOperations

STEP_KEYS = {"op", "args", "save", "expect", "expectError"}
EXPECT_STEP_KEYS = {"op", "target", *ASSERTIONS}
SCENARIO_KEYS = {"name", "description", "steps"}


class ConformanceError(Exception):
    """A scenario file or folder cannot be used as given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioResult:
    """The outcome of one scenario: passed, or the step that failed and why."""

    name: str
    passed: bool
    message: str = ""
    step: int | None = None  # 1-based index of the failing step

    def __str__(self) -> str:
        if self.passed:
            return f"PASS {self.name}"
        where = f" (step {self.step})" if self.step is not None else ""
        return f"FAIL {self.name}{where}: {self.message}"


# ------------------------------------------------------------------- loading
def scenario_files(directory: str | Path) -> list[Path]:
    """Return the *.json scenario files of a folder, sorted by name."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ConformanceError(f"The conformance scenario folder {folder} does not exist.")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ConformanceError(f"The conformance scenario folder {folder} holds no *.json files.")
    return files


def load_scenario(path: str | Path) -> dict[str, Any]:
    """Read and shape-check one scenario file."""
    path = Path(path)
    try:
        scenario = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConformanceError(f"Scenario file {path} cannot be read as JSON: {exc}") from exc
    if not isinstance(scenario, dict):
        raise ConformanceError(f"Scenario file {path} must hold a JSON object.")
    if not isinstance(scenario.get("name"), str) or not isinstance(scenario.get("steps"), list):
        raise ConformanceError(f"Scenario file {path} needs a string 'name' and a list of 'steps'.")
    return scenario


def load_scenarios(directory: str | Path) -> list[dict[str, Any]]:
    """Load every scenario of a folder, in file-name order."""
    return [load_scenario(path) for path in scenario_files(directory)]


# ----------------------------------------------------------------------- ops
def _submit(
    store: LeaseOperations,
    name: str,
    payload: Any = None,
    key: str | None = None,
    queue: str = DEFAULT_QUEUE,
    conflict: str = DEFAULT_CONFLICT,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    priority: int = DEFAULT_PRIORITY,
    metadata: dict | None = None,
    correlation_id: str | None = None,
    run_at_delay_ms: int = 0,
) -> TaskRecord:
    return store.submit(
        name, payload, key=key, queue=queue, conflict=conflict, max_attempts=max_attempts,
        priority=priority, metadata=metadata, correlation_id=correlation_id,
        delay_ms=run_at_delay_ms,
    )


def _list(store: LeaseOperations, filters: dict | None = None, **kwargs: Any) -> list[TaskRecord]:
    # Scenarios may pass the filters flat or wrapped as {"filters": {...}}.
    return store.list(**(filters or {}), **kwargs)


def _claim(
    store: LeaseOperations,
    queues: list[str],
    worker_id: str,
    lease_ms: int = DEFAULT_LEASE_MS,
    limit: int = 1,
    names: list[str] | None = None,
) -> list[TaskRecord]:
    return store.claim(
        queues=queues, worker_id=worker_id, lease_ms=lease_ms, limit=limit, names=names
    )


def _heartbeat_batch(
    store: LeaseOperations, ids: list[str], worker_id: str, lease_ms: int = DEFAULT_LEASE_MS
) -> list[dict[str, Any]]:
    held = store.heartbeat_batch(ids, worker_id, lease_ms)
    # The store answers a map; scenarios read the rows still held, in asked order.
    return [
        {"id": task_id, "cancel_requested": held[task_id]} for task_id in ids if task_id in held
    ]


# Ops whose arguments are the store method's own take that method, unbound
# (looked up when a step runs: the store reaches the models, and this module
# loads before Django is set up): _bind checks the step's arguments against
# its signature, the store first.
STORE_OPS = ("get_by_key", "get_status_by_key", "cancel_by_key", "retry_by_key", "purge", "stats",
             "queue_depth")
OPS: dict[str, Callable[..., Any]] = {
    "submit": _submit,
    "get": lambda store, id: store.get(id),
    "get_status": lambda store, id: store.get_status(id),
    "list": _list,
    "cancel": lambda store, id: store.cancel(id),
    "retry": lambda store, id, reset_attempt=False: store.retry(id, reset_attempt=reset_attempt),
    "claim": _claim,
    "heartbeat": lambda store, id, worker_id, lease_ms=DEFAULT_LEASE_MS: store.heartbeat(
        id, worker_id, lease_ms
    ),
    "heartbeat_batch": _heartbeat_batch,
    "progress": lambda store, id, worker_id, progress=None, message=None: store.progress(
        id, worker_id, progress, message
    ),
    "succeed": lambda store, id, worker_id, result=None: store.succeed(id, worker_id, result),
    "complete": lambda store, id, worker_id, result=None: store.complete(id, worker_id, result),
    "fail": lambda store, id, worker_id, error, retryable=True, delay_ms=0: store.fail(
        id, worker_id, error, retryable, delay_ms
    ),
    "sleep": lambda store, ms: time.sleep(ms / 1000),
}


def _bind(op: str, args: Any) -> Callable[[LeaseOperations], Any]:
    if op not in OPS and op not in STORE_OPS:
        known = ", ".join(sorted([*OPS, *STORE_OPS]))
        raise StepFailed(f"Unknown op {op!r}; this runner knows {known}, expect.")
    if not isinstance(args, dict):
        raise StepFailed(f"The args of {op} must be an object, got {args!r}.")
    if op in STORE_OPS:
        from ..store.leases import LeaseOperations

        function = getattr(LeaseOperations, op)
    else:
        function = OPS[op]
    signature = inspect.signature(function)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if not takes_any:
        unknown = set(args) - set(list(signature.parameters)[1:])
        if unknown:
            raise StepFailed(f"{op} has no argument {', '.join(sorted(unknown))}.")
    try:
        signature.bind(None, **args)
    except TypeError as exc:
        raise StepFailed(f"{op} was called with the wrong arguments: {exc}.") from exc
    return lambda store: function(store, **args)


# -------------------------------------------------------------------- steps
def _run_step(store: LeaseOperations, step: Any, saved: dict[str, Any]) -> None:
    if not isinstance(step, dict) or not isinstance(step.get("op"), str):
        raise StepFailed(f"A step must be an object with a string 'op', got {step!r}.")
    op = step["op"]
    if op == "expect":
        unknown = set(step) - EXPECT_STEP_KEYS
        if unknown:
            raise StepFailed(f"An expect step has no key {', '.join(sorted(unknown))}.")
        if "target" not in step:
            raise StepFailed("An expect step needs a 'target'.")
        assertions = {key: step[key] for key in ASSERTIONS if key in step}
        if not assertions:
            raise StepFailed("An expect step needs at least one assertion.")
        check(resolve(step["target"], saved), assertions, saved)
        return

    unknown = set(step) - STEP_KEYS
    if unknown:
        raise StepFailed(f"A {op} step has no key {', '.join(sorted(unknown))}.")
    call = _bind(op, resolve(step.get("args", {}), saved))
    expected_error = step.get("expectError")
    try:
        value = call(store)
    except StepFailed:
        raise
    except Exception as exc:
        kind = type(exc).__name__
        if expected_error is None:
            raise StepFailed(f"{op} raised {kind}: {exc}") from exc
        if kind != expected_error:
            raise StepFailed(f"{op} raised {kind} ({exc}), expected {expected_error}.") from exc
        value = {"task_id": getattr(exc, "task_id", None), "type": kind}
    else:
        if expected_error is not None:
            raise StepFailed(
                f"{op} was expected to raise {expected_error} but returned {describe(value)}."
            )
    if "save" in step:
        if not isinstance(step["save"], str) or not step["save"]:
            raise StepFailed(f"save takes an alias name, got {step['save']!r}.")
        saved[step["save"]] = value
    if "expect" in step:
        if not isinstance(step["expect"], dict):
            raise StepFailed(f"expect takes an object of assertions, got {step['expect']!r}.")
        check(value, step["expect"], saved)


def run_scenario(store: LeaseOperations, scenario: dict[str, Any]) -> ScenarioResult:
    """Run one scenario's steps in order and report the first that fails."""
    name = str(scenario.get("name", "<unnamed>"))
    unknown = set(scenario) - SCENARIO_KEYS
    if unknown:
        return ScenarioResult(
            name=name, passed=False,
            message=f"The scenario has unknown key {', '.join(sorted(unknown))}.",
        )
    steps = scenario.get("steps")
    if not isinstance(steps, list) or not steps:
        return ScenarioResult(name=name, passed=False, message="The scenario has no steps.")
    saved: dict[str, Any] = {}
    for number, step in enumerate(steps, start=1):
        try:
            _run_step(store, step, saved)
        except StepFailed as exc:
            op = step.get("op") if isinstance(step, dict) else None
            return ScenarioResult(
                name=name, passed=False, step=number, message=f"{op}: {exc}" if op else str(exc)
            )
    return ScenarioResult(name=name, passed=True)


def clear_tasks(store: LeaseOperations) -> None:
    """Delete every CairnQ task and key row on the store's database."""
    from ..models import TaskKey

    with store.atomic():  # keys first: a key row points at its task
        TaskKey.objects.using(store.using).all().delete()
        store.tasks().all().delete()


def run_scenarios(
    store: LeaseOperations,
    scenarios: Iterable[dict[str, Any]],
    on_result: Callable[[ScenarioResult], None] | None = None,
) -> list[ScenarioResult]:
    """Run scenarios one after another, each on empty CairnQ tables."""
    results = []
    for scenario in scenarios:
        clear_tasks(store)
        result = run_scenario(store, scenario)
        results.append(result)
        if on_result is not None:
            on_result(result)
    clear_tasks(store)
    return results
