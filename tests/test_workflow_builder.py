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
