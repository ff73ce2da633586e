"""The workflows' admin: the list, the graph page, cancel and retry behind a permission, logged;
the dashboard's and cairnq_status's counts; the sweeper's backstop."""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client

from cairnq_django import Workflow, get_workflow
from cairnq_django.models import Workflow as WorkflowRow
from cairnq_django.retention.sweeper import RetentionSweeper
from cairnq_django.workflows.control import release_finished_steps
from tests.test_schedule_admin import messages_of, staff

pytestmark = pytest.mark.django_db

LIST = "/admin/cairnq_django/workflow/"


def page(run_id: str) -> str:
    return f"{LIST}{quote(run_id)}/change/"


def act_url(run_id: str) -> str:
    return f"{LIST}{quote(run_id)}/act/"


def enqueue_diamond(name: str = "diamond"):
    wf = Workflow(name)
    top = wf.add("top", "tests.wf.step")
    left = wf.add("left", "tests.wf.step", after=top)
    right = wf.add("<b>right</b>", "tests.wf.step", after=top)
    wf.add("bottom", "tests.wf.step", after=[left, right])
    return wf.enqueue()


def finish_by_another_sdk(store, run_id: str, name: str, status: str = "succeeded") -> None:
    """Claim and settle a step's task with the plain store, as a worker of another SDK would."""
    [task] = store.claim(queues=["default"], worker_id="peer", limit=1)
    assert task.metadata["cairnq_workflow"]["name"] == name
    if status == "succeeded":
        store.complete(task.id, "peer", {"by": "peer"})
    else:
        store.fail(task.id, "peer", "boom", retryable=False)


def test_the_list_and_the_graph_page_show_steps_escaped_and_linked(admin_client, store):
    run = enqueue_diamond("<i>wf</i>")
    listing = admin_client.get(LIST).content.decode()
    assert run.id in listing and "&lt;i&gt;wf&lt;/i&gt;" in listing and "<i>wf</i>" not in listing
    html = admin_client.get(page(run.id)).content.decode()
    assert "<svg" in html and "<b>right</b>" not in html and "&lt;b&gt;right&lt;/b&gt;" in html
    top_task = get_workflow(run.id).step("top").task_id
    assert f'href="/admin/cairnq_django/task/{quote(top_task)}/change/"' in html
    assert 'class="cq-wf-step cq-wf-queued"' in html and 'class="cq-wf-step cq-wf-waiting"' in html
    assert 'value="cancel"' in html  # the superuser may manage it


def test_unknown_and_hostile_ids_are_404_not_500(admin_client, store):
    for bad in ("wf_nope", "wf_%00x", "x" * 5000):
        assert admin_client.get(page(bad)).status_code == 404
    assert admin_client.get(LIST + "?q=%00").status_code == 400


def test_cancel_needs_the_permission_and_is_logged(client, store):
    run = enqueue_diamond()
    client.force_login(staff("view_workflow"))
    html = client.get(page(run.id)).content.decode()
    assert 'value="cancel"' not in html
    assert client.post(act_url(run.id), {"action": "cancel"}).status_code == 403
    assert get_workflow(run.id).state == "running"
    manager = Client()
    user = User.objects.create_user("manager", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="cairnq_django", codename__in=["view_workflow", "manage_workflow"]
    ))
    manager.force_login(user)
    assert manager.get(act_url(run.id)).status_code == 405
    response = manager.post(act_url(run.id), {"action": "cancel"}, follow=True)
    assert messages_of(response) == [f"Canceled workflow {run.id}: 4 steps had not ended."]
    assert get_workflow(run.id).state == "canceled"
    entry = LogEntry.objects.get()
    assert entry.object_id == run.id and "cancel" in entry.change_message
    bad = manager.post(act_url(run.id), {"action": "explode"}, follow=True)
    assert messages_of(bad) == ["Unknown action."]


def test_retry_from_the_page_reruns_a_failed_workflow(admin_client, store):
    run = enqueue_diamond()
    finish_by_another_sdk(store, run.id, "top", status="failed")
    release_finished_steps()
    assert get_workflow(run.id).state == "failed"
    response = admin_client.post(act_url(run.id), {"action": "failed_only"}, follow=True)
    assert messages_of(response) == [f"Retrying workflow {run.id} (failed_only): 4 steps run again."]
    run = get_workflow(run.id)
    assert run.state == "running" and run.step("top").state == "queued"


def test_the_backstop_releases_steps_another_sdk_finished(store):
    run = enqueue_diamond()
    finish_by_another_sdk(store, run.id, "top")
    # A plain settle released nothing: that is the backstop's job.
    assert get_workflow(run.id).step("left").state == "waiting"
    RetentionSweeper(rules={"succeeded": 86_400_000}).sweep_once()
    run = get_workflow(run.id)
    assert [run.step(n).state for n in ("top", "left", "<b>right</b>", "bottom")] == [
        "succeeded", "queued", "queued", "waiting",
    ]
    assert release_finished_steps() == 0  # nothing twice


def test_status_and_dashboard_count_workflows_by_state(admin_client, store, capsys):
    enqueue_diamond()
    WorkflowRow.objects.create(id="wf_done", name="old", state="succeeded", created_at_ms=1)
    call_command("cairnq_status", "--json")
    assert json.loads(capsys.readouterr().out)["workflows"] == {
        "running": 1, "succeeded": 1, "failed": 0, "canceled": 0,
    }
    call_command("cairnq_status")
    assert "Workflows: 1 running, 1 succeeded, 0 failed, 0 canceled" in capsys.readouterr().out
    html = admin_client.get("/admin/cairnq_django/task/dashboard/").content.decode()
    assert f'<a href="{LIST}?state__exact=running">1 running</a>' in html
