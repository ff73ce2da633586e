"""The admin's schedules page and its run now / pause / resume actions."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.test import override_settings
from django.urls import reverse

from cairnq_django.models import ScheduleState, Task

pytestmark = pytest.mark.django_db

PAGE = "/admin/cairnq_django/schedulestate/"

SCHEDULE = {
    "nightly-report": {"task": "tests.echo", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                       "queue": "reports"},
    "poll-feeds": {"task": "tests.record", "every": 300_000},
}


@pytest.fixture(autouse=True)
def schedule_settings():
    with override_settings(CAIRNQ={"SCHEDULE": SCHEDULE}):
        yield


def staff(*codenames: str) -> User:
    user = User.objects.create_user("staff", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="cairnq_django", codename__in=codenames)
    )
    return user


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def act(client, action, name="nightly-report"):
    return client.post(PAGE, {"action": action, "schedule": name}, follow=True)


def test_the_page_lists_schedules_in_words_with_next_runs(admin_client):
    assert reverse("admin:cairnq_django_schedulestate_changelist") == PAGE
    page = admin_client.get(PAGE).content.decode()
    assert "At 03:00 every day (Europe/Paris)" in page
    assert "<code>0 3 * * *</code>" in page
    assert "Every 5 minutes" in page and "<code>every" not in page
    assert page.count(" 03:00:00 CE") == 3  # the next three nightly runs, Paris time
    assert page.count("never") == 2
    assert 'value="run"' in page and 'value="pause"' in page


def test_the_admin_index_links_to_the_page(admin_client):
    assert PAGE in admin_client.get("/admin/").content.decode()


def test_run_now_enqueues_and_the_last_run_links_to_its_task(admin_client):
    response = act(admin_client, "run")
    task = Task.objects.get(metadata__schedule="nightly-report")
    assert messages_of(response) == [
        f"Enqueued tests.echo {task.id} for schedule “nightly-report”."
    ]
    assert (task.queue, task.metadata["trigger"]) == ("reports", "manual")
    page = response.content.decode()
    link = reverse("admin:cairnq_django_task_change", args=[quote(task.id)])
    assert f'<a href="{link}">{task.id}</a>' in page
    assert "cq-status-queued" in page
    entry = LogEntry.objects.get()
    assert entry.object_repr == "nightly-report"


def test_pause_and_resume_survive_as_state(admin_client):
    response = act(admin_client, "pause")
    assert messages_of(response) == ["Paused “nightly-report”."]
    assert ScheduleState.objects.get(name="nightly-report").paused
    page = response.content.decode()
    assert 'value="resume"' in page and "paused" in page
    assert messages_of(act(admin_client, "pause")) == ["“nightly-report” was already paused."]
    response = act(admin_client, "resume")
    assert messages_of(response) == ["Resumed “nightly-report”; it carries on from now."]
    assert not ScheduleState.objects.get(name="nightly-report").paused


def test_viewing_needs_the_view_permission(client):
    client.force_login(staff())
    assert client.get(PAGE).status_code == 403


def test_each_action_needs_its_own_permission(client):
    client.force_login(staff("view_schedulestate"))
    page = client.get(PAGE).content.decode()
    assert "nightly-report" in page and 'value="run"' not in page and 'value="pause"' not in page
    assert client.post(PAGE, {"action": "run", "schedule": "nightly-report"}).status_code == 403
    assert client.post(PAGE, {"action": "pause", "schedule": "nightly-report"}).status_code == 403
    assert not Task.objects.exists() and not ScheduleState.objects.filter(paused=True).exists()


def test_run_permission_does_not_allow_pausing(client):
    client.force_login(staff("view_schedulestate", "run_schedule"))
    page = client.get(PAGE).content.decode()
    assert 'value="run"' in page and 'value="pause"' not in page
    assert client.post(PAGE, {"action": "pause", "schedule": "poll-feeds"}).status_code == 403
    assert act(client, "run", "poll-feeds").status_code == 200
    assert Task.objects.filter(metadata__schedule="poll-feeds").count() == 1


def test_pause_permission_does_not_allow_running(client):
    client.force_login(staff("view_schedulestate", "pause_schedule"))
    assert client.post(PAGE, {"action": "run", "schedule": "poll-feeds"}).status_code == 403
    assert messages_of(act(client, "pause", "poll-feeds")) == ["Paused “poll-feeds”."]


def test_an_unknown_schedule_or_action_is_refused_with_a_message(admin_client):
    assert messages_of(act(admin_client, "run", "nope")) == [
        "No schedule named 'nope' in settings.CAIRNQ['SCHEDULE'] (known: nightly-report, "
        "poll-feeds)."
    ]
    assert messages_of(act(admin_client, "explode")) == ["Unknown action."]
    assert not Task.objects.exists()


def test_a_schedule_gone_from_settings_is_shown_stopped_without_actions(admin_client):
    act(admin_client, "run", "poll-feeds")
    with override_settings(CAIRNQ={"SCHEDULE": {}}):
        page = admin_client.get(PAGE).content.decode()
    assert "Not in settings.CAIRNQ['SCHEDULE'] any more: stopped." in page
    assert 'value="run"' not in page


def test_no_schedules(admin_client):
    with override_settings(CAIRNQ={}):
        page = admin_client.get(PAGE).content.decode()
    assert "No schedules: settings.CAIRNQ['SCHEDULE'] is empty." in page
