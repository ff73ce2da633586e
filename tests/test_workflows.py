"""Workflow shapes run by real worker processes: chain, fan-out/fan-in, diamond, policies, grafts,
cancel and the three retry modes."""

import json
import os
import signal

import pytest

from cairnq_django import Workflow, get_workflow, list_tasks, wait_workflow
from tests.workerutil import WorkerProcess, run_burst, runs, wait_for

pytestmark = pytest.mark.slow

FANOUT = int(os.environ.get("CAIRNQ_TEST_WORKFLOW_FANOUT", "1000"))


def drain(env):
    return run_burst(env, "--concurrency", "4", "--poll", "50")


def journal():
    """(step name, start ms) per handler run that journaled, in run order."""
    notes = [json.loads(r[3]) for r in runs() if r[3].startswith("{")]
    return [(note["step"], note["start"]) for note in notes]


def test_a_chain_of_five_passes_each_result_down(live_store, child_env):
    wf = Workflow("chain")
    previous = None
    for index in range(5):
        previous = wf.add(f"s{index}", "tests.wf.step", {"value": 1}, after=previous)
    run = wf.enqueue()
    drain(child_env)
    run = get_workflow(run.id)
    assert run.state == "succeeded" and run.progress == 1.0
    assert [s.result for s in run.steps] == [{"value": n} for n in range(1, 6)]


def test_a_fan_out_fans_in_with_every_result_in_order(live_store, child_env):
    wf = Workflow("fan")
    fetched = wf.map("fetch", "tests.wf.step", [{"value": i} for i in range(FANOUT)])
    wf.add("index", "tests.wf.collect", after=fetched)
    run = wf.enqueue()
    drain(child_env)
    run = get_workflow(run.id)
    assert run.state == "succeeded"
    assert run.step("index").result == {"fetch": list(range(FANOUT))}
    # One task row per step, inserted once.
    assert len(list_tasks(correlation_id=run.id, limit=FANOUT + 10)) == FANOUT + 1


def test_a_diamond_joins_both_branches(live_store, child_env):
    wf = Workflow("diamond")
    top = wf.add("top", "tests.wf.step", {"value": 1})
    left = wf.add("left", "tests.wf.step", {"value": 10}, after=top)
    right = wf.add("right", "tests.wf.step", {"value": 100}, after=top)
    wf.add("bottom", "tests.wf.step", after=[left, right])
    run = wf.enqueue()
    drain(child_env)
    run = get_workflow(run.id)
    assert run.state == "succeeded"
    assert run.step("bottom").result == {"value": 11 + 101}


def test_when_finished_runs_after_a_failure_and_succeeded_is_canceled(live_store, child_env):
    wf = Workflow("policies")
    bad = wf.add("bad", "tests.wf.step", {"fail": True})
    wf.add("after_ok", "tests.wf.step", after=bad)
    wf.add("deeper", "tests.wf.step", after="after_ok")
    wf.add("notify", "tests.wf.collect", after=bad, when="finished")
    run = wf.enqueue()
    drain(child_env)
    run = get_workflow(run.id)
    assert run.state == "failed"
    states = {s.name: s.state for s in run.steps}
    assert states == {"bad": "failed", "after_ok": "canceled", "deeper": "canceled", "notify": "succeeded"}
    [envelope] = run.step("notify").result["bad"]
    assert envelope["status"] == "failed" and envelope["result"] is None
    assert envelope["error"]["code"] == "step_failed"
    # Steps canceled upstream of their run never became tasks.
    assert run.step("after_ok").task_id is None and run.step("deeper").task_id is None


def test_a_graft_of_ten_steps_runs_before_the_sink(live_store, child_env, runs_table):
    wf = Workflow("graft")
    grower = wf.add("grower", "tests.wf.step", {"graft": 10, "blocks": "sink", "journal": True})
    wf.add("sink", "tests.wf.step", {"journal": True}, after=grower)
    run = wf.enqueue()
    drain(child_env)
    run = get_workflow(run.id)
    assert run.state == "succeeded" and run.steps_total == 12
    # The sink's value is the grower's (0) plus one from each graft.
    assert run.step("sink").result == {"value": 10}
    assert [name for name, _ in journal()] == ["grower", "sink"]


def test_cancel_mid_run_ends_the_workflow_canceled(live_store, child_env):
    wf = Workflow("cancel")
    slow = wf.add("slow", "tests.wf.step", {"until_canceled": True})
    wf.add("next", "tests.wf.step", after=slow)
    run = wf.enqueue()
    worker = WorkerProcess(child_env, "--poll", "50")
    try:
        wait_for(lambda: get_workflow(run.id).step("slow").state == "running", timeout=60)
        assert get_workflow(run.id).cancel() == 2
        # The waiting step ends at once; the running one when its worker sees the cancel.
        assert get_workflow(run.id).step("next").state == "canceled"
        worker.signal(signal.SIGTERM)
        worker.wait(90)
    finally:
        worker.stop()
    run = get_workflow(run.id)
    assert run.state == "canceled"
    assert {s.name: s.state for s in run.steps} == {"slow": "canceled", "next": "canceled"}


def _failing_workflow():
    wf = Workflow("retry")
    a = wf.add("a", "tests.wf.step", {"journal": True, "value": 1})
    b = wf.add("b", "tests.wf.step", {"journal": True, "fail_first": "b"}, after=a)
    wf.add("c", "tests.wf.step", {"journal": True}, after=b)
    wf.add("n", "tests.wf.step", {"journal": True}, after=b, when="finished")
    return wf.enqueue()


@pytest.mark.parametrize(
    ("mode", "runs_by_step"),
    [
        ("failed_only", {"a": 1, "b": 2, "c": 1, "n": 1}),
        ("failed_and_downstream", {"a": 1, "b": 2, "c": 1, "n": 2}),
        ("all", {"a": 2, "b": 2, "c": 1, "n": 2}),
    ],
)
def test_each_retry_mode_reruns_what_it_says(live_store, child_env, runs_table, mode, runs_by_step):
    run = _failing_workflow()
    drain(child_env)
    assert get_workflow(run.id).state == "failed"
    get_workflow(run.id).retry(mode)
    drain(child_env)
    run = wait_workflow(run.id, timeout=30)
    assert run.state == "succeeded", {s.name: s.state for s in run.steps}
    names = [name for name, _ in journal()]
    assert {name: names.count(name) for name in runs_by_step} == runs_by_step
    assert run.step("c").result == {"value": 1}


@pytest.mark.parametrize("how", ["call", "raise"])
def test_a_snoozed_step_keeps_its_attempt_and_releases_its_child(live_store, child_env, runs_table, how):
    from cairnq_django import get_task

    wf = Workflow("snoozed")
    nap = wf.add("nap", "tests.snooze", {"times": 1, "delay": 0.05, "how": how})
    wf.add("after", "tests.wf.step", {"value": 1}, after=nap)
    run = wf.enqueue()
    # Not a burst: the snoozed step comes due after the queue first looks empty.
    worker = WorkerProcess(child_env, "-v", "2")
    try:
        wait_for(lambda: get_workflow(run.id).state != "running", timeout=60, message=worker.output())
    finally:
        worker.stop()
    run = get_workflow(run.id)
    assert run.state == "succeeded", run
    assert {s.name: s.state for s in run.steps} == {"nap": "succeeded", "after": "succeeded"}
    history = get_task(run.step("nap").task_id)
    assert [a.outcome for a in history.attempts] == ["snoozed", "succeeded"]
