"""The admin dashboard and the task page's Cancel / Retry buttons and progress view."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.urls import reverse

from cairnq_django.admin.views.dashboard import MINUTE_MS, chart_svg, throughput
from cairnq_django.models import Task, WorkerRecord
from cairnq_django.observability.overview import database_now_ms

from .test_admin import detail_url, make

DASHBOARD = "/admin/cairnq_django/task/dashboard/"


def staff(client, *codenames):
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="cairnq_django", codename__in=codenames)
    )
    client.force_login(user)
    return user


def finished_at(task, ms):
    Task.objects.filter(pk=task.id).update(completed_at_ms=ms)


def add_worker(worker_id, *, seen_ago_ms=0, queues=("default",)):
    now = database_now_ms("default")
    return WorkerRecord.objects.create(
        id=worker_id, host="web-1", pid=321, queues=list(queues), concurrency=8,
        version="0.1.0", started_at_ms=now - 3_600_000, last_seen_ms=now - seen_ago_ms,
        interval_ms=10_000, tasks_done=12,
    )


def test_throughput_counts_each_status_per_minute(store):
    now = database_now_ms("default")
    this_minute = now // MINUTE_MS * MINUTE_MS
    for status, minutes_ago in [("succeeded", 0), ("succeeded", 0), ("failed", 5),
                                ("canceled", 59), ("succeeded", 61)]:
        finished_at(make(store, status), this_minute - minutes_ago * MINUTE_MS)
    data = throughput("default", now)
    assert data.per_minute["succeeded"][59] == 2
    assert data.per_minute["failed"][54] == 1
    assert data.per_minute["canceled"][0] == 1
    assert data.total == {"succeeded": 2, "failed": 1, "canceled": 1}  # 61 min ago is out


def test_the_chart_is_svg_with_a_line_per_finished_status(store):
    now = database_now_ms("default")
    finished_at(make(store, "succeeded"), now)
    svg = str(chart_svg(throughput("default", now)))
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" id="cq-throughput"')
    lines = re.findall(r'<polyline points="([^"]+)"[^>]*class="cq-line cq-line-(\w+)"', svg)
    assert [status for _, status in lines] == ["succeeded", "failed", "canceled"]
    assert all(len(points.split()) == 60 for points, _ in lines)
    assert "succeeded 1, failed 0, canceled 0" in svg


def test_the_dashboard_shows_queues_workers_and_what_they_run(client, store):
    staff(client, "view_task")
    running = make(store, "running", name="imports.csv")
    Task.objects.filter(pk=running.id).update(worker_id="worker_LIVE", progress=0.4)
    make(store, "queued", queue="mail")
    add_worker("worker_LIVE")
    add_worker("worker_GONE", seen_ago_ms=3_600_000)
    page = client.get(DASHBOARD)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<meta http-equiv="refresh" content="5">' in html
    assert 'id="cq-throughput"' in html
    assert re.search(r'<tr data-queue="mail" class="cq-unserved">', html)
    assert '<tr data-queue="default">' in html
    assert 'data-worker="worker_LIVE" class="cq-live"' in html
    assert 'data-worker="worker_GONE" class="cq-gone"' in html
    assert f'<a href="{detail_url(running.id)}">imports.csv</a>' in html
    assert '<progress class="cq-progress" max="100" value="40"></progress> 40%' in html
    assert "Workers (1 live)" in html


def test_the_dashboard_needs_the_view_permission(client, store):
    staff(client)
    assert client.get(DASHBOARD).status_code == 403


def test_the_changelist_links_to_the_dashboard(admin_client, store):
    assert f'href="{DASHBOARD}"' in admin_client.get("/admin/cairnq_django/task/").content.decode()


def buttons(client, task_id):
    html = client.get(detail_url(task_id)).content.decode()
    names = ("cq-cancel", "cq-retry", "cq-retry-reset")
    return {name for name in names if f'class="button {name}"' in html}


def test_the_buttons_follow_status_and_permissions(client, store):
    queued, failed = make(store, "queued"), make(store, "failed")
    staff(client, "view_task")
    assert buttons(client, queued.id) == set() and buttons(client, failed.id) == set()
    User.objects.get().user_permissions.add(*Permission.objects.filter(
        codename__in=["cancel_task", "retry_task"]))
    client.force_login(User.objects.get())
    assert buttons(client, queued.id) == {"cq-cancel"}
    assert buttons(client, failed.id) == {"cq-retry", "cq-retry-reset"}
    assert buttons(client, make(store, "succeeded").id) == set()


def test_cancel_and_retry_from_the_task_page(admin_client, store):
    queued, running = make(store, "queued"), make(store, "running")
    failed = make(store, "failed")
    cancel = lambda t: reverse("admin:cairnq_django_task_cancel", args=[t.id])  # noqa: E731
    retry = lambda t: reverse("admin:cairnq_django_task_retry", args=[t.id])  # noqa: E731

    response = admin_client.post(cancel(queued))
    assert response.status_code == 302
    assert response["Location"] == detail_url(queued.id)
    assert store.get(queued.id).status == "canceled"
    response = admin_client.post(cancel(running), follow=True)
    assert store.get(running.id).cancel_requested_at_ms is not None
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Canceled the task.",
        "Asked the running task to stop; it ends canceled when its worker notices.",
    ]
    assert buttons(admin_client, running.id) == set()  # asked already

    admin_client.post(retry(failed), {"reset_attempt": "1"})
    assert (store.get(failed.id).status, store.get(failed.id).attempt) == ("queued", 0)
    response = admin_client.post(retry(failed), follow=True)  # queued now: refused
    assert [str(m) for m in get_messages(response.wsgi_request)][-1] == (
        "Only a failed or canceled task can be retried."
    )
    logged = LogEntry.objects.filter(action_flag=CHANGE).values_list("object_id",
                                                                     "change_message")
    assert sorted(logged) == sorted([
        (queued.id, "Canceled."), (running.id, "Cancel requested."),
        (failed.id, "Retried with attempts reset."),
    ])
    assert admin_client.get(cancel(queued)).status_code == 405


def test_the_buttons_refuse_users_without_the_permission(client, store):
    queued, failed = make(store, "queued"), make(store, "failed")
    staff(client, "view_task")
    assert client.post(reverse("admin:cairnq_django_task_cancel", args=[queued.id])
                       ).status_code == 403
    assert client.post(reverse("admin:cairnq_django_task_retry", args=[failed.id])
                       ).status_code == 403
    assert store.get(queued.id).status == "queued" and store.get(failed.id).status == "failed"


@pytest.mark.parametrize("task_id", ["nonexistent", "task_" + "0" * 26])
def test_the_task_urls_answer_404_for_an_unknown_id(admin_client, store, task_id):
    for name in ("cancel", "retry"):
        url = reverse(f"admin:cairnq_django_task_{name}", args=[task_id])
        assert admin_client.post(url).status_code == 404
    url = reverse("admin:cairnq_django_task_progress", args=[task_id])
    assert admin_client.get(url).status_code == 404


def test_a_running_task_page_has_the_live_panel_and_its_json(admin_client, store):
    running = make(store, "running")
    store.progress(running.id, "w1", 0.25, "a quarter")
    html = admin_client.get(detail_url(running.id)).content.decode()
    progress_url = reverse("admin:cairnq_django_task_progress", args=[running.id])
    quoted_url = reverse("admin:cairnq_django_task_progress", args=[quote(running.id)])
    assert f'<div id="cq-live" data-url="{quoted_url}"' in html
    assert '<span class="cq-live-message">a quarter</span>' in html
    assert "cairnq_django/task_live.js" in html
    assert admin_client.get(progress_url).json() == {
        "status": "running", "progress": 0.25, "progress_invalid": False,
        "message": "a quarter", "cancel_requested": False,
    }
    assert 'id="cq-live"' not in admin_client.get(detail_url(make(store, "queued").id)
                                                  ).content.decode()


def test_the_workers_list_is_read_only_and_shows_liveness(client, store):
    staff(client, "view_workerrecord")
    add_worker("worker_LIVE")
    add_worker("worker_GONE", seen_ago_ms=3_600_000)
    page = client.get("/admin/cairnq_django/workerrecord/")
    assert page.status_code == 200
    html = page.content.decode()
    rows = re.findall(r'<tr>.*?</tr>', html, re.S)
    live = next(row for row in rows if "worker_LIVE" in row)
    gone = next(row for row in rows if "worker_GONE" in row)
    assert "cq-status-succeeded\">live<" in live and "cq-status-canceled\">gone<" in gone
    assert "1 h 0 min ago" in gone
    assert 'name="action"' not in html  # no delete action
    detail = client.get("/admin/cairnq_django/workerrecord/worker_LIVE/change/")
    assert detail.status_code == 200 and "web-1" in detail.content.decode()
    assert client.post("/admin/cairnq_django/workerrecord/worker_LIVE/delete/").status_code == 403
    assert WorkerRecord.objects.count() == 2


def test_a_task_page_links_its_worker_and_the_worker_page_its_tasks(admin_client, store):
    running = make(store, "running", name="imports.csv")
    Task.objects.filter(pk=running.id).update(worker_id="worker_LIVE")
    other = make(store, "running")  # held by "w1", which has no row
    add_worker("worker_LIVE")
    worker_url = reverse("admin:cairnq_django_workerrecord_change", args=[quote("worker_LIVE")])
    assert f'<a href="{worker_url}">worker_LIVE</a>' in admin_client.get(
        detail_url(running.id)).content.decode()
    assert '<div class="readonly">w1</div>' in admin_client.get(
        detail_url(other.id)).content.decode()
    page = admin_client.get(worker_url).content.decode()
    task_url = reverse("admin:cairnq_django_task_change", args=[quote(running.id)])
    assert f'<li><a href="{task_url}">{running.id}</a> imports.csv</li>' in page
