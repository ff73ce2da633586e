"""Workflow step handlers the workflow tests run in real worker processes."""

import json
import time

from django.db import connections

from cairnq_django import TaskError, task
from cairnq_django.store import get_store

from .tasks import RUNS_TABLE, record_run


def _values(parents) -> int:
    total = 0
    for value in parents.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and isinstance(item.get("value"), int):
                total += item["value"]
    return total


def _first_run(ctx, marker: str) -> bool:
    """Record a run under `marker`; True if it is the first (the runs table is the memory)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {RUNS_TABLE} WHERE note = %s", [marker])
        first = cursor.fetchone()[0] == 0
    record_run(ctx, marker)
    return first


@task("tests.wf.step")
def wf_step(ctx, payload):
    """One step: journals its start, may sleep, fail or graft; returns its value plus its parents'."""
    if payload.get("journal"):
        started = get_store().clock_ms()
        record_run(ctx, json.dumps({"step": ctx.metadata["cairnq_workflow"]["name"], "start": started}))
    if payload.get("until_canceled"):
        deadline = time.monotonic() + 60
        while not ctx.canceled() and time.monotonic() < deadline:
            time.sleep(0.05)
    if payload.get("sleep"):
        time.sleep(payload["sleep"])
    if payload.get("fail_first") and _first_run(ctx, payload["fail_first"]):
        raise TaskError("step_failed", "This step fails its first run on purpose.")
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
