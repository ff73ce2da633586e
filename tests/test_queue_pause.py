"""Pausing a queue: the API, the claim and its probe, the command, cairnq_status and the admin."""

from __future__ import annotations

import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from cairnq_django import enqueue, pause_queue, paused_queues, resume_queue
from cairnq_django.models import QueueState
from tests.test_query_plans import explain_each, recorded, uses_index
from tests.test_schedule_admin import messages_of, staff

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/cairnq_django/task/dashboard/"
PAUSE = "/admin/cairnq_django/queuestate/pause/"


def run(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("cairnq_queue", *args, stdout=out)
    return out.getvalue()


# ------------------------------------------------------------------ the API
def test_pause_and_resume_are_idempotent_and_recorded(store):
    assert paused_queues() == []
    assert pause_queue("emails", by="alice") is True
    assert pause_queue("emails", by="bob") is False
    state = QueueState.objects.get(queue="emails")
    assert (state.paused, state.changed_by) == (True, "alice")
    assert paused_queues() == ["emails"]
    assert resume_queue("emails", by="carol") is True
    assert resume_queue("emails") is False
    assert resume_queue("never-paused") is False
    assert not QueueState.objects.filter(queue="never-paused").exists()
    state.refresh_from_db()
    assert (state.paused, state.changed_by) == (False, "carol")
    assert paused_queues() == []


@pytest.mark.parametrize("queue", ["", None, 3, ["emails"], b"emails", "x" * 256, "a\x00b"])
def test_a_bad_queue_name_is_a_clear_error(store, queue):
    with pytest.raises(ValueError, match="queue"):
        pause_queue(queue)
    with pytest.raises(ValueError, match="queue"):
        resume_queue(queue)
    assert not QueueState.objects.exists()


def test_by_must_be_text(store):
    with pytest.raises(ValueError, match="by must be a string"):
        pause_queue("emails", by=7)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the claim
def test_the_claim_and_its_probe_skip_a_paused_queue_and_enqueue_still_works(store):
    held = enqueue("tests.echo", {}, queue="emails")
    other = enqueue("tests.echo", {}, queue="reports")
    pause_queue("emails")
    late = enqueue("tests.echo", {}, queue="emails")  # still accepted
    assert store.probe_idle(queues=["emails"]).work is False
    assert store.claim(queues=["emails"], worker_id="w", limit=10) == []
    claimed = store.claim(queues=["emails", "reports"], worker_id="w", limit=10)
    assert [t.id for t in claimed] == [other.id]
    assert store.claim(queues=["emails"], worker_id="w", limit=10, names=["tests.echo"]) == []
    resume_queue("emails")
    assert store.probe_idle(queues=["emails"]).work is True
    claimed = store.claim(queues=["emails"], worker_id="w", limit=10)
    assert {t.id for t in claimed} == {held.id, late.id}


def test_a_running_task_of_a_paused_queue_finishes(store):
    enqueue("tests.echo", {}, queue="emails")
    (task,) = store.claim(queues=["emails"], worker_id="w")
    pause_queue("emails")
    assert store.complete(task.id, "w", {"ok": True}).status == "succeeded"


def test_the_paused_claim_still_searches_the_claim_index(store):
    for i in range(20):
        enqueue("tests.echo", {"i": i}, queue="q2")
    pause_queue("elsewhere")
    with recorded() as statements:
        claimed = store.claim(queues=["q2"], worker_id="w2", limit=5)
    assert len(claimed) == 5
    claims = explain_each(statements, "SET status = %s, worker_id = %s")
    assert claims
    for text in claims:
        assert uses_index(text, "cairnq_tasks_claim_idx"), text


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the NOTIFY is PostgreSQL's")
def test_resume_notifies_the_queue_as_an_enqueue_does(live_store):
    import psycopg

    settings = connection.settings_dict
    listener = psycopg.connect(
        dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"],
        port=settings["PORT"] or 5432, autocommit=True,
    )
    try:
        listener.execute("LISTEN cairnq_queued")
        pause_queue("emails")
        resume_queue("emails")
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert got == ["emails"]
    finally:
        listener.close()
        QueueState.objects.all().delete()


# -------------------------------------------------------------- the command
def test_the_command_pauses_lists_and_resumes(store):
    enqueue("tests.echo", {}, queue="emails")
    enqueue("tests.echo", {}, queue="reports")
    assert "Paused 'emails'" in run("pause", "emails")
    assert "already paused" in run("pause", "emails")
    assert QueueState.objects.get(queue="emails").changed_by == "manage.py cairnq_queue"
    pause_queue("idle")  # paused and holding no task: listed all the same
    lines = run("list").splitlines()
    assert lines[0].split() == ["QUEUE", "QUEUED", "RUNNING", "STATE"]
    assert lines[1].split()[:4] == ["emails", "1", "0", "paused"]
    assert lines[2].split()[:4] == ["idle", "0", "0", "paused"]
    assert lines[3].split() == ["reports", "1", "0", "active"]
    data = json.loads(run("list", "--json"))
    by_queue = {row["queue"]: row for row in data["queues"]}
    assert by_queue["emails"]["paused"] is True and by_queue["emails"]["queued"] == 1
    assert by_queue["reports"]["paused"] is False and by_queue["reports"]["changed_by"] is None
    assert "Resumed 'emails'" in run("resume", "emails")
    assert "was not paused" in run("resume", "emails")


@pytest.mark.parametrize("args, message", [
    (("pause",), "pause needs the name of a queue"),
    (("resume",), "resume needs the name of a queue"),
    (("list", "emails"), "list takes no queue name"),
    (("pause", "emails", "--json"), "--json goes with list and limits only"),
    (("pause", ""), "queue must be a non-empty string"),
    (("pause", "x" * 300), "at most 255 characters"),
])
def test_the_command_refuses_bad_input_in_one_line(store, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_the_command_help_explains(store):
    from cairnq_django.management.commands.cairnq_queue import Command

    text = Command().create_parser("manage.py", "cairnq_queue").format_help()
    assert "pause QUEUE" in text and "resume QUEUE" in text and "other CairnQ SDKs" in text


def test_cairnq_status_shows_paused_queues(store):
    from io import StringIO

    enqueue("tests.echo", {}, queue="emails")
    pause_queue("emails")
    pause_queue("idle")
    out = StringIO()
    call_command("cairnq_status", stdout=out)
    text = out.getvalue()
    assert "Paused queues (no Django worker claims from them): emails, idle" in text
    assert [line.split()[-1] for line in text.splitlines() if line.startswith("emails")] == [
        "paused"
    ]
    out = StringIO()
    call_command("cairnq_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["paused_queues"] == ["emails", "idle"]


def test_cairnq_health_does_not_report_a_paused_queue_as_stuck(store):
    enqueue("tests.echo", {}, queue="emails")  # no live worker serves it
    pause_queue("emails")
    call_command("cairnq_health")  # exits 0: raises nothing


# ---------------------------------------------------------------- the admin
def test_the_dashboard_shows_the_state_and_the_buttons(admin_client, store):
    enqueue("tests.echo", {}, queue="emails")
    enqueue("tests.echo", {}, queue="reports")
    pause_queue("emails")
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'cq-status-paused' in page
    assert f'action="{PAUSE}"' in page
    assert 'name="queue" value="emails"><input type="hidden" name="action" value="resume"' in page
    assert 'name="queue" value="reports"><input type="hidden" name="action" value="pause"' in page


def test_pause_and_resume_from_the_dashboard_are_logged(admin_client, store):
    enqueue("tests.echo", {}, queue="emails")
    response = admin_client.post(PAUSE, {"action": "pause", "queue": "emails"}, follow=True)
    assert response.redirect_chain[-1][0] == DASHBOARD
    assert messages_of(response) == [
        "Paused queue “emails”: no worker claims from it until it is resumed."
    ]
    assert paused_queues() == ["emails"]
    state = QueueState.objects.get()
    assert state.changed_by == "admin"
    entry = LogEntry.objects.get()
    assert (entry.object_repr, entry.user.username) == ("emails", "admin")
    assert "pause" in entry.get_change_message()
    response = admin_client.post(PAUSE, {"action": "pause", "queue": "emails"}, follow=True)
    assert messages_of(response) == ["Queue “emails” was already paused."]
    assert LogEntry.objects.count() == 1
    admin_client.post(PAUSE, {"action": "resume", "queue": "emails"})
    assert paused_queues() == []
    assert LogEntry.objects.count() == 2


def test_a_paused_queue_without_tasks_still_shows_with_its_resume_button(admin_client, store):
    pause_queue("idle")
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'id="cq-paused-empty"' in page and 'value="idle"' in page


def test_get_never_changes_state(admin_client, store):
    response = admin_client.get(PAUSE, {"action": "pause", "queue": "emails"})
    assert response.status_code == 405
    assert paused_queues() == []


def test_without_the_permission_there_is_no_button_and_the_post_is_refused(client, store):
    enqueue("tests.echo", {}, queue="emails")
    client.force_login(staff("view_task"))
    page = client.get(DASHBOARD).content.decode()
    assert 'cq-pause-form' not in page and 'cq-queue-active' in page
    assert client.post(PAUSE, {"action": "pause", "queue": "emails"}).status_code == 403
    assert paused_queues() == []
    assert not LogEntry.objects.exists()


def test_the_permission_alone_is_enough_to_pause(client, store):
    client.force_login(staff("view_task", "pause_queue"))
    assert client.post(PAUSE, {"action": "pause", "queue": "emails"}).status_code == 302
    assert paused_queues() == ["emails"]


def test_the_post_needs_its_csrf_token(store):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root2", password="x"))
    assert client.post(PAUSE, {"action": "pause", "queue": "emails"}).status_code == 403
    assert paused_queues() == []


@pytest.mark.parametrize("data", [
    {"action": "pause", "queue": ""},
    {"action": "pause"},
    {"action": "explode", "queue": "emails"},
    {"action": "pause", "queue": "x" * 10_000},
])
def test_bad_posts_are_messages_not_errors(admin_client, store, data):
    response = admin_client.post(PAUSE, data, follow=True)
    assert response.status_code == 200
    assert messages_of(response)
    assert paused_queues() == []


def test_a_hostile_queue_name_is_escaped_everywhere(admin_client, store):
    name = '<script>alert("q")</script>'
    enqueue("tests.echo", {}, queue=name)
    response = admin_client.post(PAUSE, {"action": "pause", "queue": name}, follow=True)
    page = response.content.decode()
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;q&quot;)&lt;/script&gt;" in page
    assert paused_queues() == [name]
    page = admin_client.get("/admin/cairnq_django/queuestate/").content.decode()
    assert "<script>alert" not in page


def test_the_queue_states_list_is_read_only(admin_client, store):
    pause_queue("emails", by="alice")
    page = admin_client.get("/admin/cairnq_django/queuestate/").content.decode()
    assert "emails" in page and "alice" in page
    assert admin_client.get("/admin/cairnq_django/queuestate/add/").status_code == 403
