"""What a step's settle writes between its parent's completion and its child's start, statement by statement.

The release shares its parent's completion transaction, so every statement
here is paid on the hop from one step to the next (bench/workflow_hop.py).
The lists pin it: a change that adds a round trip fails here, on both
databases, and must say why. The release's own statements are compiled
once (workflows/statements.py), and the child's task row is the last write
before the commit, so it is picked up as fast as an enqueued task.
"""

from __future__ import annotations

import re

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from cairnq_django import Workflow, get_workflow
from cairnq_django.workflows.settling import StepSettling

pytestmark = pytest.mark.django_db

_TABLE = re.compile(r'^(UPDATE|SELECT .*? FROM|INSERT INTO) "(\w+)"', re.S)
_SHORT = {
    "cairnq_tasks": "task",
    "cairnq_django_workflow_step": "step",
    "cairnq_django_workflow": "workflow",
}


def settle(store, task_id: str) -> list[tuple[str, str]]:
    """Complete a claimed step as the worker does; the (verb, table) of each statement it ran."""
    with CaptureQueriesContext(connections[store.using]) as captured:
        StepSettling(store).complete(task_id, "w", {"value": 1})
    statements = []
    savepoints = 0
    for query in captured.captured_queries:
        sql = query["sql"].split(";")[-1].strip()  # after the worker's SET LOCAL, if any
        verb = sql.split()[0].upper()
        if verb in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "SET"):
            savepoints += verb == "SAVEPOINT"
            continue
        match = _TABLE.match(sql)
        assert match, sql[:120]
        statements.append((verb, _SHORT.get(match.group(2), match.group(2))))
    # The settle's own transaction is a savepoint inside the test's; the release adds none.
    assert savepoints == 1
    return statements


def claim(store, name: str):
    [task] = store.claim(queues=["default"], worker_id="w", limit=1)
    assert task.metadata["cairnq_workflow"]["name"].split("[")[0] == name  # a map's step is p[i]
    return task


def test_a_chain_step_releases_its_child_in_six_statements_the_insert_last(store):
    wf = Workflow("chain")
    wf.add("b", "tests.wf.step", after=wf.add("a", "tests.wf.step"))
    run = wf.enqueue()
    assert settle(store, claim(store, "a").id) == [
        ("UPDATE", "task"),      # the completion, owned
        ("UPDATE", "step"),      # a's end: its row lock and the check that it is still open
        ("SELECT", "step"),      # a's waiting children, locked in id order
        ("UPDATE", "workflow"),  # one step fewer open (and the end, had it been the last)
        ("UPDATE", "step"),      # b released
        ("INSERT", "task"),      # b's task row, last before the commit
    ]
    assert [s.state for s in get_workflow(run.id).steps] == ["succeeded", "queued"]
    # The last step: nothing to release, and the count-down ends the workflow in the same UPDATE.
    assert settle(store, claim(store, "b").id) == [
        ("UPDATE", "task"), ("UPDATE", "step"), ("SELECT", "step"), ("UPDATE", "workflow"),
    ]
    assert get_workflow(run.id).state == "succeeded"


def test_a_fan_in_parent_that_is_not_the_last_counts_its_child_down_in_one_statement(store):
    wf = Workflow("fan-in")
    wf.add("sink", "tests.wf.step", after=wf.map("p", "tests.wf.step", [{}, {}, {}]))
    run = wf.enqueue()
    for _ in range(2):
        assert settle(store, claim(store, "p").id) == [
            ("UPDATE", "task"), ("UPDATE", "step"), ("SELECT", "step"),
            ("UPDATE", "step"),      # the sink's count, down by one
            ("UPDATE", "workflow"),
        ]
    assert settle(store, claim(store, "p").id)[-2:] == [("UPDATE", "step"), ("INSERT", "task")]
    assert get_workflow(run.id).step("sink").state == "queued"
