"""Workflow.enqueue(): what it writes, key reuse, and hostile graphs refused before any write."""

import math

import pytest

from cairnq_django import InvalidWorkflow, SerializationError, Workflow, get_workflow, list_tasks
from cairnq_django.models import Task, WorkflowEdge, WorkflowStep
from cairnq_django.models import Workflow as WorkflowRow


def nothing_written():
    return (WorkflowRow.objects.count(), WorkflowStep.objects.count(), WorkflowEdge.objects.count(),
            Task.objects.count()) == (0, 0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_enqueue_writes_steps_and_only_the_first_due_tasks():
    wf = Workflow("shape")
    a = wf.add("a", "tests.wf.step", {"value": 1})
    f = wf.map("f", "tests.wf.step", [{"value": i} for i in range(3)], after=a)
    wf.add("z", "tests.wf.collect", after=f, when="finished")
    run = wf.enqueue()
    assert run.state == "running"
    assert [s.name for s in run.steps] == ["a", "f[0]", "f[1]", "f[2]", "z"]
    assert [s.state for s in run.steps] == ["queued", "waiting", "waiting", "waiting", "waiting"]
    tasks = list_tasks(correlation_id=run.id)
    assert [t.name for t in tasks] == ["tests.wf.step"]
    assert tasks[0].metadata["cairnq_workflow"]["name"] == "a"
    assert WorkflowEdge.objects.count() == 6
    assert dict(WorkflowStep.objects.values_list("name", "pending")) == {
        "a": 0, "f[0]": 1, "f[1]": 1, "f[2]": 1, "z": 3,
    }
    assert run.progress == 0.0


@pytest.mark.django_db(transaction=True)
def test_a_running_workflow_with_the_same_key_is_returned():
    first = Workflow("keyed", key="site:1")
    first.add("a", "tests.wf.step")
    run = first.enqueue()
    again = Workflow("keyed", key="site:1")
    again.add("a", "tests.wf.step")
    again.add("b", "tests.wf.step")
    assert again.enqueue().id == run.id
    assert WorkflowRow.objects.count() == 1 and Task.objects.count() == 1
    WorkflowRow.objects.filter(pk=run.id).update(state="succeeded")
    assert again.enqueue().id != run.id  # a finished workflow frees its key


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda wf: (wf.add("a", "t", after="b"), wf.add("b", "t", after="a")),
         "Workflow 'hostile' has a cycle: steps 'a', 'b' wait on each other."),
        (lambda wf: wf.add("a", "t", after="nope"),
         "Step 'a' of workflow 'hostile' runs after 'nope', which is not a step of this workflow."),
        (lambda wf: (wf.add("a", "t"), wf.add("a", "t")), "Workflow 'hostile' has two steps named 'a'."),
        (lambda wf: (wf.map("m", "t", [{}]), wf.add("m[0]", "t")),
         "Workflow 'hostile' has two steps named 'm[0]'."),
        (lambda wf: (wf.map("m", "t", [{}]), wf.add("m", "t")),
         "Workflow 'hostile' has two steps named 'm'."),
        (lambda wf: wf.add("a", "t", when="sometimes"),
         "when= of step 'a' of workflow 'hostile' must be one of succeeded, finished, got 'sometimes'."),
        (lambda wf: wf.add("a", "t", key="k"),
         "Step 'a' of workflow 'hostile' got unknown options: key (give the workflow a key= instead)."),
        (lambda wf: wf.map("m", "t", [{}] * 100_000),
         "Workflow 'hostile' has 100000 steps; one enqueue() takes at most 20000."),
    ],
)
@pytest.mark.django_db(transaction=True)
def test_hostile_graphs_are_refused_at_enqueue_with_nothing_written(build, message):
    wf = Workflow("hostile")
    build(wf)
    with pytest.raises(InvalidWorkflow) as raised:
        wf.enqueue()
    assert str(raised.value) == message
    assert nothing_written()


@pytest.mark.parametrize("payload", [{"x": math.nan}, {"when": object()}, {"b": b"bytes"}])
@pytest.mark.django_db(transaction=True)
def test_a_payload_that_is_not_json_is_refused_with_nothing_written(payload):
    wf = Workflow("hostile")
    wf.add("ok", "t", {"fine": 1})
    wf.add("bad", "t", payload, after="ok")
    with pytest.raises(SerializationError, match="payload of step 'bad' of workflow 'hostile'"):
        wf.enqueue()
    assert nothing_written()


@pytest.mark.django_db(transaction=True)
def test_bad_options_and_an_empty_workflow_are_refused():
    with pytest.raises(InvalidWorkflow, match="has no steps"):
        Workflow("empty").enqueue()
    wf = Workflow("opts")
    wf.add("a", "t", priority="high")
    with pytest.raises(ValueError, match="priority must be an integer"):
        wf.enqueue()
    with pytest.raises(ValueError, match="concurrency must be"):
        Workflow("c", concurrency=0)
    assert nothing_written()


@pytest.mark.django_db(transaction=True)
def test_get_workflow_of_an_unknown_id_raises_does_not_exist():
    with pytest.raises(WorkflowRow.DoesNotExist):
        get_workflow("wf_nope")


@pytest.mark.django_db(transaction=True)
def test_chain_group_and_chord_build_the_celery_shapes():
    from cairnq_django import chain, chord, group, sig

    run = chain(sig("tests.wf.step", {"value": 1}), "tests.wf.step", "tests.wf.step").enqueue()
    assert [(s.name, s.state) for s in run.steps] == [
        ("step0", "queued"), ("step1", "waiting"), ("step2", "waiting"),
    ]
    run = group([sig("tests.wf.step", {"value": i}) for i in range(3)], key="g").enqueue()
    assert [s.state for s in run.steps] == ["queued"] * 3 and run.key == "g"
    members = [sig("tests.wf.step", {"value": i}, priority=5) for i in range(3)]
    run = chord(members, "tests.wf.collect").enqueue()
    assert [s.name for s in run.steps] == ["member0", "member1", "member2", "callback"]
    assert WorkflowStep.objects.get(workflow_id=run.id, name="callback").pending == 3
    assert {t.priority for t in list_tasks(correlation_id=run.id)} == {5}


@pytest.mark.django_db(transaction=True)
def test_concurrency_caps_the_steps_through_a_flow_limit_removed_at_the_end(store):
    from cairnq_django import effective_limits
    from cairnq_django.workflows.control import cancel_workflow

    wf = Workflow("capped", concurrency=2)
    wf.map("m", "tests.wf.step", [{}] * 3)
    run = wf.enqueue()
    key = f"cairnq.workflow:{run.id}"
    assert [(x.scope, x.value, x.concurrency) for x in effective_limits()] == [("key_prefix", key, 2)]
    assert {t.id for t in list_tasks(correlation_id=run.id)} == {s.task_id for s in run.steps}
    claimed = store.claim_limited(limits=effective_limits(), queues=["default"], worker_id="w", limit=3)
    assert len(claimed.tasks) == 2  # the third waits for a slot
    cancel_workflow(run.id)
    for task in claimed.tasks:
        store.fail(task.id, "w", "stop", retryable=False)
    from cairnq_django.workflows.control import release_finished_steps

    release_finished_steps()
    assert get_workflow(run.id).state == "canceled"
    assert effective_limits() == []


@pytest.mark.django_db(transaction=True)
def test_wait_workflow_times_out_with_the_state_and_has_an_async_twin():
    from asgiref.sync import async_to_sync

    from cairnq_django import WorkflowTimeout, await_workflow, wait_workflow

    wf = Workflow("slow")
    wf.add("a", "tests.wf.step")
    run = wf.enqueue()
    with pytest.raises(WorkflowTimeout, match=f"Workflow {run.id} is still running after 0.2 s."):
        wait_workflow(run.id, timeout=0.2)
    with pytest.raises(WorkflowTimeout):
        # Under async_to_sync its database reads run on this thread, on the test's connection.
        async_to_sync(await_workflow)(run.id, timeout=0.2)
