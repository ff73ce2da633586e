"""Workflow step handlers the workflow tests run in real worker processes."""

import json
import time

from cairnq_django import TaskError, task
from cairnq_django.store import get_store

from .tasks import record_run


def _values(parents) -> int:
    total = 0
    for value in parents.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and isinstance(item.get("value"), int):
                total += item["value"]
    return total


@task("tests.wf.step")
def wf_step(ctx, payload):
    """One step: journals its start, may sleep, fail or graft; returns its value plus its parents'."""
    if payload.get("journal"):
        started = get_store().clock_ms()
        record_run(ctx, json.dumps({"step": ctx.metadata["cairnq_workflow"]["name"], "start": started}))
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail"):
        raise TaskError("step_failed", "This step fails on purpose.")
    for index in range(payload.get("graft", 0)):
        ctx.workflow.add(f"graft{index}", "tests.wf.step", {"value": 1}, blocks=payload.get("blocks"))
    return {"value": payload.get("value", 0) + _values(ctx.parents)}


@task("tests.wf.collect")
def wf_collect(ctx, payload):
    """A fan-in: every parent group's values in order (envelopes as they are, for when="finished")."""
    return {
        group: [item.get("value") if isinstance(item, dict) and "status" not in item else item
                for item in (value if isinstance(value, list) else [value])]
        for group, value in ctx.parents.items()
    }
