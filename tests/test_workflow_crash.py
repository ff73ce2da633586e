"""Workflows released exactly once while workers are SIGKILLed, with no reconciler running.

Three `cairnq_worker` processes drain WORKFLOWS workflows of 20 steps each
(root, a fan-out of 10 into a join with 10 parents, a fan-out of 7 into a
sink with 7 parents); every ~2 s one of them is SIGKILLed and a fresh one
started, so kills land inside handlers and inside settle transactions.
The sweeper's backstop is not run: every release must come from a settle.

Checked: every workflow succeeded; every step has exactly one task row
(a child inserted twice, or never, shows here); every handler start of a
step (its journal, from the database's clock) came after all its parents'
tasks completed; no step is left waiting or released.
"""

import json
import os
import random
import signal
import time
from collections import Counter, defaultdict

import pytest

from cairnq_django import Workflow
from cairnq_django.models import Task, WorkflowEdge, WorkflowStep
from cairnq_django.models import Workflow as WorkflowRow
from tests.workerutil import WorkerProcess, runs

pytestmark = pytest.mark.slow

# CI runs 20; the size is CAIRNQ_TEST_WORKFLOW_CRASH_COUNT=50.
WORKFLOWS = int(os.environ.get("CAIRNQ_TEST_WORKFLOW_CRASH_COUNT", "20"))
WORKERS = 3
KILL_EVERY_S = 2.0
DEADLINE_S = 600


def _workflow(index: int) -> None:
    step = {"journal": True, "sleep": 0.01}
    wf = Workflow(f"crash{index}")
    root = wf.add("root", "tests.wf.step", step, max_attempts=50)
    fan = wf.map("fan", "tests.wf.step", [step] * 10, after=root, max_attempts=50)
    join = wf.add("join", "tests.wf.step", step, after=fan, max_attempts=50)
    fan2 = wf.map("fan2", "tests.wf.step", [step] * 7, after=join, max_attempts=50)
    wf.add("sink", "tests.wf.step", step, after=fan2, max_attempts=50)
    wf.enqueue()


def _worker(env):
    return WorkerProcess(env, "--lease", "1500", "--concurrency", "4", "--poll", "100")


def test_workflows_finish_exactly_once_while_workers_are_killed(live_store, child_env, runs_table):
    for index in range(WORKFLOWS):
        _workflow(index)
    workers = [_worker(child_env) for _ in range(WORKERS)]
    kills = 0
    try:
        deadline = time.monotonic() + DEADLINE_S
        while WorkflowRow.objects.filter(state="running").exists():
            assert time.monotonic() < deadline, "The workflows did not finish in time."
            time.sleep(KILL_EVERY_S)
            victim = random.randrange(WORKERS)
            workers[victim].signal(signal.SIGKILL)
            workers[victim].wait(30)
            workers[victim].stop()
            workers[victim] = _worker(child_env)
            kills += 1
    finally:
        for worker in workers:
            worker.stop()
    assert kills >= 1
    assert Counter(WorkflowRow.objects.values_list("state", flat=True)) == {"succeeded": WORKFLOWS}
    assert not WorkflowStep.objects.exclude(state="succeeded").exists()
    # Exactly one task row per step: its release inserted it once.
    steps = {s.pk: s for s in WorkflowStep.objects.all()}
    rows = Counter(
        t["metadata"]["cairnq_workflow"]["step"] for t in Task.objects.values("metadata")
    )
    assert len(steps) == 20 * WORKFLOWS and set(rows) == set(steps) and set(rows.values()) == {1}
    # No step started before every parent completed.
    completed = dict(Task.objects.values_list("id", "completed_at_ms"))
    task_of = {s.pk: s.task_id for s in steps.values()}
    step_of_task = {s.task_id: s.pk for s in steps.values()}
    parents = defaultdict(list)
    for parent, child in WorkflowEdge.objects.values_list("parent_id", "child_id"):
        parents[child].append(parent)
    starts = 0
    for task_id, _worker_id, _attempt, note in runs():
        started = json.loads(note)["start"]
        step = step_of_task[task_id]
        for parent in parents[step]:
            assert started >= completed[task_of[parent]], (steps[step].name, steps[parent].name)
        starts += 1
    assert starts >= 20 * WORKFLOWS
