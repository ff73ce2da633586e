"""The task admin through Django's own views: listing, detail, actions, permissions, stats."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from cairnq_django.admin.changelist import BoundedCountPaginator
from cairnq_django.admin.filters import DistinctValueFilter
from cairnq_django.humanize import human_duration
from cairnq_django.models import Task

from .storeutil import make, shift

CHANGELIST = "/admin/cairnq_django/task/"
STATS = "/admin/cairnq_django/task/stats/"


def detail_url(task_id: str) -> str:
    return reverse("admin:cairnq_django_task_change", args=[quote(task_id)])


def status_of(store, task_id: str) -> str | None:
    task = store.get(task_id)
    return None if task is None else task.status


def post_action(client, action: str, ids, **extra):
    data = {"action": action, "_selected_action": list(ids), "index": "0", **extra}
    return client.post(CHANGELIST, data, follow=True)


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def listed_ids(response) -> list[str]:
    return [task.id for task in response.context["cl"].result_list]


def staff(*codenames: str) -> User:
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="cairnq_django", codename__in=codenames)
    )
    return User.objects.get(pk=user.pk)  # drop the permission cache


# ---------------------------------------------------------------- changelist
def test_changelist_shows_columns_newest_first(admin_client, store):
    older = make(store, "succeeded", name="emails.send")
    running = make(store, "running", name="reports.build")
    store.progress(running.id, "w1", 0.42)
    keyed = store.submit("emails.send", key="invoice-7")

    response = admin_client.get(CHANGELIST)

    assert response.status_code == 200
    assert listed_ids(response) == [keyed.id, running.id, older.id]
    html = response.content.decode()
    assert 'class="cq-status cq-status-running"' in html
    assert 'class="cq-status cq-status-succeeded"' in html
    assert '<progress class="cq-progress" max="100" value="42"></progress> 42%</span>' in html
    assert "invoice-<wbr>7" in html  # a line may break after the dash, never inside a word
    assert f'<span class="cq-id" title="{keyed.id}">…{keyed.id[-8:]}</span>' in html
    assert "1/3" in html  # attempt/max_attempts of the claimed task
    assert "Queue stats" in html


def test_changelist_never_counts_the_whole_table(admin_client, store):
    for _ in range(3):
        store.submit("job")
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(CHANGELIST)
        admin_client.get(CHANGELIST + "?status__exact=queued")
    counts = [
        q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "cairnq_tasks" in q["sql"]
    ]
    assert counts, "the paginator should count (boundedly)"
    for sql in counts:
        assert re.search(r"LIMIT \d+", sql), sql
    distinct = [q["sql"] for q in queries if "DISTINCT" in q["sql"].upper()]
    assert distinct == []
    # Even a one-page result is read with a LIMIT (SQLite plans it better).
    pages = [q["sql"] for q in queries if '"cairnq_tasks"."attempt"' in q["sql"]]
    assert len(pages) == 2
    for sql in pages:
        assert re.search(r"LIMIT \d+", sql), sql
        # The list shows no free-text column, so it reads none (see test_admin_hostile.py).
        for column in ("payload", "metadata", "result", "error", "message"):
            assert f'"cairnq_tasks"."{column}"' not in sql, column


def test_paginator_reports_a_bound_past_its_limit(admin_client, store, monkeypatch):
    monkeypatch.setattr(BoundedCountPaginator, "COUNT_LIMIT", 3)
    monkeypatch.setattr("cairnq_django.admin.TaskAdmin.list_per_page", 2)
    for _ in range(5):
        store.submit("job", queue="bulk")

    response = admin_client.get(CHANGELIST + "?queue=bulk")

    paginator = response.context["cl"].paginator
    assert paginator.count == 3
    assert paginator.count_is_exact is False
    assert "more than 3 tasks" in response.content.decode()
    assert "Select all matching tasks" in response.content.decode()
    assert len(listed_ids(response)) == 2


def test_paginator_counts_exactly_under_its_limit(admin_client, store):
    for _ in range(3):
        store.submit("job")
    response = admin_client.get(CHANGELIST)
    assert response.context["cl"].paginator.count == 3
    assert response.context["cl"].paginator.count_is_exact
    assert "3 tasks" in response.content.decode()


def test_filters_by_status_queue_and_name(admin_client, store):
    queued = make(store, "queued", name="a.job", queue="mail")
    failed = make(store, "failed", name="b.job", queue="mail")
    other = make(store, "queued", name="b.job", queue="reports")

    assert listed_ids(admin_client.get(CHANGELIST + "?status__exact=failed")) == [failed.id]
    assert set(listed_ids(admin_client.get(CHANGELIST + "?queue=mail"))) == {queued.id, failed.id}
    assert set(listed_ids(admin_client.get(CHANGELIST + "?name=b.job"))) == {failed.id, other.id}
    both = admin_client.get(CHANGELIST + "?name=b.job&queue=reports&status__exact=queued")
    assert listed_ids(both) == [other.id]


def test_filter_choices_come_from_the_index_and_are_capped(admin_client, store, monkeypatch):
    for queue in ("q3", "q1", "q2"):
        store.submit("job", queue=queue)
    response = admin_client.get(CHANGELIST)
    queue_filter = next(f for f in response.context["cl"].filter_specs if f.title == "queue")
    assert [c["display"] for c in queue_filter.choices(response.context["cl"])][1:] == [
        "q1", "q2", "q3"
    ]

    monkeypatch.setattr(DistinctValueFilter, "MAX_CHOICES", 2)
    response = admin_client.get(CHANGELIST + "?queue=q3")
    queue_filter = next(f for f in response.context["cl"].filter_specs if f.title == "queue")
    # The first two values, plus the one currently selected.
    assert [c["display"] for c in queue_filter.choices(response.context["cl"])][1:] == [
        "q1", "q2", "q3"
    ]
    status_filter = next(f for f in response.context["cl"].filter_specs if f.title == "status")
    assert [c["display"] for c in status_filter.choices(response.context["cl"])][1:] == [
        "queued", "running", "succeeded", "failed", "canceled"
    ]


def test_search_by_id_name_key_and_correlation_id(admin_client, store):
    by_id = store.submit("alpha")
    by_name = store.submit("emails.send")
    by_key = store.submit("beta", key="order-42")
    by_corr = store.submit("gamma", correlation_id="req-9")

    def search(term):
        return listed_ids(admin_client.get(CHANGELIST, {"q": term}))

    assert search(by_id.id) == [by_id.id]
    assert search("emails.send") == [by_name.id]
    assert search("order-42") == [by_key.id]
    assert search("  req-9 ") == [by_corr.id]
    assert search("emails") == []  # exact matches only: substrings would scan the table


def test_tree_links_filter_the_changelist(admin_client, store):
    parent = store.submit("parent")
    child = store.submit("child", parent_id=parent.id, root_id=parent.id)
    store.submit("unrelated")
    response = admin_client.get(CHANGELIST, {"root_id": parent.id})
    assert set(listed_ids(response)) == {parent.id, child.id}


# -------------------------------------------------------------------- detail
def test_detail_is_read_only_and_escapes_json(admin_client, store):
    task = store.submit(
        "render", {"html": "<script>alert('x')</script>", "n": 1},
        metadata={"who": "<b>me</b>"}, correlation_id="corr-1", key="page-1",
    )

    response = admin_client.get(detail_url(task.id))

    assert response.status_code == 200
    html = response.content.decode()
    assert "<script>alert(" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "&lt;b&gt;me&lt;/b&gt;" in html
    assert '<pre class="cq-json">{\n  &quot;html&quot;' in html  # pretty-printed
    assert 'name="_save"' not in html
    assert "page-1" in html
    assert f'href="{CHANGELIST}?correlation_id=corr-1"' in html


def test_detail_shows_times_as_dates_and_family_links(admin_client, store):
    parent = make(store, "succeeded", name="parent")
    child = store.submit("child", parent_id=parent.id, root_id=parent.id)
    shift(store, parent.id, "created_at_ms", -(parent.created_at_ms - 1_700_000_000_000))

    response = admin_client.get(detail_url(parent.id))
    html = response.content.decode()
    assert '<time datetime="2023-11-14T22:13:20+00:00">2023-11-14 22:13:20.000 UTC</time>' in html
    assert "1700000000000" not in html
    assert f'href="{detail_url(child.id)}"' in html
    assert "this task" in html  # a top-level task is its own root

    child_page = admin_client.get(detail_url(child.id)).content.decode()
    assert child_page.count(f'href="{detail_url(parent.id)}"') >= 2  # parent and root


def test_add_change_and_delete_are_refused(admin_client, store):
    task = make(store, "succeeded")
    assert admin_client.get(CHANGELIST + "add/").status_code == 403
    assert admin_client.post(detail_url(task.id), {"name": "x"}).status_code == 403
    delete = reverse("admin:cairnq_django_task_delete", args=[task.id])
    assert admin_client.get(delete).status_code == 403
    assert status_of(store, task.id) == "succeeded"
    actions = admin_client.get(CHANGELIST).context["action_form"].fields["action"].choices
    assert "delete_selected" not in [name for name, _ in actions]


# ------------------------------------------------------------------- actions
def test_cancel_action(admin_client, store):
    queued = make(store, "queued", name="a")
    running = make(store, "running", name="b")
    done = make(store, "succeeded", name="c")

    response = post_action(admin_client, "cancel_tasks", [queued.id, running.id, done.id])

    assert response.status_code == 200
    assert status_of(store, queued.id) == "canceled"
    after = store.get(running.id)
    assert after.status == "running" and after.cancel_requested_at_ms is not None
    assert status_of(store, done.id) == "succeeded"
    assert messages_of(response) == [
        "Canceled 1 queued task.",
        "Asked 1 running task to stop; it ends canceled when its worker notices.",
        "1 selected task had already finished and was left alone.",
    ]
    entries = LogEntry.objects.filter(action_flag=CHANGE).order_by("object_id")
    assert {(e.object_id, e.change_message) for e in entries} == {
        (queued.id, "Canceled."), (running.id, "Cancel requested."),
    }
    assert "cancel requested" in admin_client.get(CHANGELIST).content.decode()


def test_cancel_message_is_pluralised(admin_client, store):
    ids = [store.submit("job").id for _ in range(3)]
    response = post_action(admin_client, "cancel_tasks", ids)
    assert messages_of(response) == ["Canceled 3 queued tasks."]


def test_retry_actions_keep_or_reset_attempts(admin_client, store):
    failed = make(store, "failed", name="a", max_attempts=1)
    canceled = make(store, "canceled", name="b")
    queued = make(store, "queued", name="c")

    response = post_action(admin_client, "retry_tasks", [failed.id, canceled.id, queued.id])

    assert messages_of(response) == [
        "Queued 2 tasks again.",
        "1 selected task was not failed or canceled and was left alone.",
    ]
    again = store.get(failed.id)
    assert (again.status, again.attempt, again.error) == ("queued", 1, None)
    assert status_of(store, canceled.id) == "queued"
    assert LogEntry.objects.filter(change_message="Retried.").count() == 2

    failed_twice = make(store, "failed", name="d", max_attempts=1)
    response = post_action(admin_client, "retry_tasks_reset", [failed_twice.id])
    assert messages_of(response) == ["Queued 1 task again with its attempts reset."]
    reset = store.get(failed_twice.id)
    assert (reset.status, reset.attempt) == ("queued", 0)
    assert LogEntry.objects.filter(change_message="Retried with attempts reset.").count() == 1


def test_purge_asks_first_then_deletes_only_finished_tasks(admin_client, store):
    done = make(store, "succeeded", name="a")
    failed = make(store, "failed", name="b", key="k-failed")
    queued = make(store, "queued", name="c")
    running = make(store, "running", name="d")
    ids = [done.id, failed.id, queued.id, running.id]

    confirm = admin_client.post(
        CHANGELIST, {"action": "purge_tasks", "_selected_action": ids, "index": "0"}
    )

    assert confirm.status_code == 200
    assert confirm.templates[0].name == "admin/cairnq_django/task/purge_confirmation.html"
    html = confirm.content.decode()
    assert "2 finished tasks will be deleted" in html
    assert "2 selected tasks are still queued or running; they are not purged." in html
    assert all(status_of(store, task_id) for task_id in ids)  # nothing deleted yet

    response = post_action(admin_client, "purge_tasks", ids, post="yes")

    assert messages_of(response) == ["Purged 2 finished tasks."]
    assert store.get(done.id) is None and store.get(failed.id) is None
    assert store.get_by_key("k-failed") is None  # the key went with its task
    assert status_of(store, queued.id) == "queued"
    assert status_of(store, running.id) == "running"
    assert set(
        LogEntry.objects.filter(action_flag=DELETION).values_list("object_id", flat=True)
    ) == {done.id, failed.id}


def test_purge_confirmation_form_round_trips(admin_client, store):
    done = make(store, "succeeded")
    confirm = admin_client.post(
        CHANGELIST, {"action": "purge_tasks", "_selected_action": [done.id], "index": "0"}
    )
    html = confirm.content.decode()
    form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))
    assert form["_selected_action"] == done.id and form["post"] == "yes"
    form["csrfmiddlewaretoken"] = "x"
    response = admin_client.post(CHANGELIST, form, follow=True)
    assert messages_of(response) == ["Purged 1 finished task."]
    assert store.get(done.id) is None


def test_purge_across_all_pages_of_a_filter(admin_client, store):
    finished = [make(store, "succeeded", queue="old").id for _ in range(3)]
    live = make(store, "queued", queue="old")
    elsewhere = make(store, "succeeded", queue="other")

    url = CHANGELIST + "?queue=old"
    confirm = admin_client.post(
        url,
        {"action": "purge_tasks", "_selected_action": [finished[0]], "index": "0",
         "select_across": "1"},
    )
    assert "3 finished tasks will be deleted" in confirm.content.decode()
    assert 'name="select_across" value="1"' in confirm.content.decode()

    response = admin_client.post(
        url,
        {"action": "purge_tasks", "_selected_action": [finished[0]], "select_across": "1",
         "post": "yes"},
        follow=True,
    )
    assert messages_of(response) == ["Purged 3 finished tasks."]
    assert all(store.get(task_id) is None for task_id in finished)
    assert status_of(store, live.id) == "queued"
    assert status_of(store, elsewhere.id) == "succeeded"


def test_purge_of_live_tasks_only_is_refused(admin_client, store):
    queued = make(store, "queued")
    response = post_action(admin_client, "purge_tasks", [queued.id])
    assert response.templates[0].name == "admin/cairnq_django/task/change_list.html"
    assert messages_of(response) == [
        "None of the selected tasks has finished; only succeeded, failed or canceled tasks "
        "can be purged."
    ]
    assert status_of(store, queued.id) == "queued"


def test_store_purge_ids_keeps_live_tasks(store):
    done = make(store, "canceled")
    queued = make(store, "queued")
    assert store.purge_ids([done.id, queued.id, "task_missing", done.id], chunk_size=1) == [done.id]
    assert status_of(store, queued.id) == "queued"


# --------------------------------------------------------------- permissions
ACTION_NAMES = {"cancel_tasks", "retry_tasks", "retry_tasks_reset", "purge_tasks"}


def offered_actions(client) -> set[str]:
    form = client.get(CHANGELIST).context["action_form"]
    return set() if form is None else {name for name, _ in form.fields["action"].choices if name}


@pytest.mark.parametrize(
    ("codename", "offered"),
    [
        ("cancel_task", {"cancel_tasks"}),
        ("retry_task", {"retry_tasks", "retry_tasks_reset"}),
        ("purge_task", {"purge_tasks"}),
    ],
)
def test_each_action_needs_its_permission(client, store, codename, offered):
    client.force_login(staff("view_task", codename))
    assert offered_actions(client) == offered


def test_actions_without_permission_change_nothing(client, store):
    client.force_login(staff("view_task"))
    assert offered_actions(client) == set()
    queued = make(store, "queued", name="a")
    failed = make(store, "failed", name="b")
    done = make(store, "succeeded", name="c")
    for action, task in (
        ("cancel_tasks", queued), ("retry_tasks", failed), ("retry_tasks_reset", failed),
        ("purge_tasks", done),
    ):
        before = store.get(task.id)
        response = post_action(client, action, [task.id], post="yes")
        assert response.status_code == 200  # the plain list again: no action ran
        assert store.get(task.id) == before
    assert not LogEntry.objects.exists()


def test_admin_pages_need_view_permission(client, store):
    task = store.submit("job")
    client.force_login(staff())
    assert client.get(CHANGELIST).status_code == 403
    assert client.get(detail_url(task.id)).status_code == 403
    assert client.get(STATS).status_code == 403


# --------------------------------------------------------------------- stats
def test_stats_view(admin_client, store):
    old_queued = store.submit("job", queue="mail")
    shift(store, old_queued.id, "run_at_ms", -90 * 60_000)
    store.submit("job", queue="mail", delay_ms=3_600_000)  # not due: not "waiting"
    make(store, "succeeded", queue="mail")
    stale = make(store, "failed", queue="mail")
    shift(store, stale.id, "completed_at_ms", -2 * 3_600_000)  # finished before the last hour
    make(store, "running", queue="reports")

    response = admin_client.get(STATS)

    assert response.status_code == 200
    rows = {row["queue"]: row for row in response.context["rows"]}
    assert [count for count, _ in rows["mail"]["cells"]] == [2, 0, 1, 1, 0]
    assert rows["mail"]["total"] == 4
    assert rows["mail"]["oldest_due"].startswith("1 h 30 min")
    assert rows["mail"]["finished"] == [1, 0, 0]
    assert rows["reports"]["oldest_due"] is None
    assert response.context["totals"] == [2, 1, 1, 1, 0]
    html = response.content.decode()
    assert f'href="{CHANGELIST}?queue=mail&amp;status__exact=queued"' in html
    assert "Finished in the last hour" in html


def test_changelist_links_to_stats(admin_client, store):
    assert f'href="{STATS}"' in admin_client.get(CHANGELIST).content.decode()


def test_stats_view_with_no_tasks(admin_client, store):
    response = admin_client.get(STATS)
    assert response.status_code == 200
    assert "There are no tasks yet." in response.content.decode()


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (850, "850 ms"), (4_200, "4.2 s"), (185_000, "3 min 5 s"),
     (7_800_000, "2 h 10 min"), (3 * 86_400_000 + 3_600_000, "3 d 1 h")],
)
def test_human_duration(ms, text):
    assert human_duration(ms) == text


def test_rows_are_read_through_the_configured_alias(admin_client, store, settings):
    store.submit("job")
    assert Task.objects.count() == 1
    response = admin_client.get(CHANGELIST)
    assert response.context["cl"].queryset.db == "default"
