"""The pages added with observability and schedules, probed as the task admin is (issue 21).

- every float column holding NaN, ±Infinity or a number no percent can show:
  every page still renders, and every JSON answer is JSON;
- every list accepts only the lookups it offers;
- roles: a user who may not view a model gets the same answer for a real id
  and a made-up one on every object URL, and cannot change anything through it;
- links built from stored ids use the admin's quoting, so an id can neither
  point a link elsewhere nor come back garbled.
"""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection, models
from django.test import Client, RequestFactory
from django.urls import Resolver404, resolve

from cairnq_django import pause_queue, set_limit
from cairnq_django.models import ScheduleState, Task

from ..storeutil import make
from .admin_corpus import (
    APP_LABEL,
    admin_routes,
    assert_no_500,
    links,
    request_status,
    stored_ids,
    strict_json,
)
from .test_admin_hostile import add_schedule_state, add_worker, add_workflow

# Values a float column can be left holding by another SDK or a direct write.
# SQLite stores NaN as NULL, so there it checks the others.
NON_FINITE = [float("nan"), float("inf"), float("-inf"), 1e308, -0.5, 7.0]


def float_columns() -> list[tuple[type[models.Model], str]]:
    """Every FloatField of this app's models (found, so a new one is covered)."""
    return [
        (model, field.column)
        for model in apps.get_app_config(APP_LABEL).get_models()
        for field in model._meta.concrete_fields
        if isinstance(field, models.FloatField)
    ]


def write_everywhere(model: type[models.Model], column: str, value: float) -> None:
    table = connection.ops.quote_name(model._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {connection.ops.quote_name(column)} = %s", [value])


@pytest.fixture
def rows(store):
    """A task in each status (the running ones held by a live worker), a schedule row and a
    paused queue's row."""
    tasks = {status: make(store, status) for status in ("queued", "running", "succeeded",
                                                        "failed", "canceled")}
    add_worker("w1")
    add_schedule_state("nightly", last_task_id=tasks["succeeded"].id)
    pause_queue("mail", by="corpus")
    set_limit("key_prefix", "account:", concurrency=1, by="corpus")
    add_workflow()
    return tasks


def test_the_float_columns_are_found():
    assert (Task, "progress") in float_columns()


@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
def test_every_page_renders_any_stored_float(admin_client, rows, value):
    results = []
    for model, column in float_columns():
        write_everywhere(model, column, value)
        for route in admin_routes():
            if route.path.endswith("{id}/"):
                continue  # a redirect to change/
            urls = (
                [route.url(i) for i in stored_ids(route.model)] if route.per_object
                else [route.url()]
            )
            for url in urls:
                results.append((f"{column}={value!r} {url}", request_status(admin_client, "get",
                                                                           url)))
    assert_no_500(results)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e308, 7.0],
                         ids=repr)
def test_a_progress_no_percent_can_show_is_shown_as_invalid(admin_client, rows, value):
    running = rows["running"]
    write_everywhere(Task, "progress", value)
    if connection.vendor == "sqlite" and value != value:
        pytest.skip("SQLite stores NaN as NULL")
    assert Task.objects.get(pk=running.id).progress is not None

    listing = admin_client.get("/admin/cairnq_django/task/")
    assert listing.status_code == 200
    assert "invalid" in listing.content.decode()
    page = admin_client.get(f"/admin/cairnq_django/task/{running.id}/change/")
    assert page.status_code == 200
    assert "invalid" in page.content.decode()
    finished = admin_client.get(f"/admin/cairnq_django/task/{rows['succeeded'].id}/change/")
    assert finished.status_code == 200
    dashboard = admin_client.get("/admin/cairnq_django/task/dashboard/")
    assert dashboard.status_code == 200
    assert "invalid" in dashboard.content.decode()

    progress = admin_client.get(f"/admin/cairnq_django/task/{running.id}/progress/")
    assert progress.status_code == 200
    body = strict_json(progress.content)
    assert body["progress"] is None and body["progress_invalid"] is True


def test_a_valid_progress_is_still_a_percent(admin_client, rows):
    write_everywhere(Task, "progress", 0.426)
    running = rows["running"]
    assert "43%" in admin_client.get("/admin/cairnq_django/task/").content.decode()
    assert "43%" in admin_client.get("/admin/cairnq_django/task/dashboard/").content.decode()
    body = strict_json(admin_client.get(f"/admin/cairnq_django/task/{running.id}/progress/")
                       .content)
    assert body["progress"] == pytest.approx(0.426) and body["progress_invalid"] is False


def test_cairnq_status_json_stays_json(rows, capsys):
    write_everywhere(Task, "progress", float("inf"))
    call_command("cairnq_status", "--json")
    body = strict_json(capsys.readouterr().out)
    [worker] = body["workers"]
    assert [t["progress"] for t in worker["running"]] == [None]


# ------------------------------------------------------- offered lookups only
def changelists() -> list[tuple[type[models.Model], str]]:
    return [(route.model, route.url()) for route in admin_routes()
            if route.model is not None and route.path.count("/") == 2]


def unoffered_queries(model: type[models.Model]) -> list[str]:
    """A lookup of every kind on every column, minus what the model's admin offers."""
    offered = getattr(admin.site._registry[model], "url_lookups", frozenset())
    queries = []
    for field in model._meta.concrete_fields:
        for lookup in ("", "__exact", "__regex", "__iregex", "__contains", "__icontains",
                       "__in", "__isnull", "__gt", "__startswith"):
            key = field.name + lookup
            if key not in offered:
                queries.append(f"{key}=x")
    return queries


def test_every_list_refuses_the_lookups_it_does_not_offer(admin_client, rows):
    results = []
    for model, url in changelists():
        model_admin = admin.site._registry[model]
        for query in unoffered_queries(model):
            response = admin_client.get(f"{url}?{query}")
            # The schedules page is not a filtered list: it ignores the query string.
            refused = response.status_code == 400 or (
                response.status_code == 200 and "cl" not in (response.context or {})
            )
            results.append((f"{type(model_admin).__name__} {query}", refused))
    assert [where for where, refused in results if not refused] == []


def test_a_backtracking_regex_never_reaches_the_database(admin_client, rows):
    add_worker("a" * 16 + "!")  # short: before the fix SQLite ran it
    response = admin_client.get("/admin/cairnq_django/workerrecord/?id__regex=(a%2B)%2B%24")
    assert response.status_code == 400


def test_the_workers_search_still_finds_by_host_and_refuses_a_huge_term(admin_client, rows):
    found = admin_client.get("/admin/cairnq_django/workerrecord/?q=web")
    assert found.status_code == 200
    assert [w.pk for w in found.context["cl"].result_list] == ["w1"]
    assert admin_client.get("/admin/cairnq_django/workerrecord/?q=" + "x" * 100_000
                            ).status_code == 400


# -------------------------------------------------------------------- roles
ROLES = {
    "superuser": None,
    "no permissions": (),
    "view tasks": ("view_task",),
    "cancel and retry, no view": ("cancel_task", "retry_task"),
    "view tasks, cancel and retry": ("view_task", "cancel_task", "retry_task"),
    "view workers": ("view_workerrecord",),
    "schedules: view, run, pause": ("view_schedulestate", "run_schedule", "pause_schedule"),
    "run and pause schedules, no view": ("run_schedule", "pause_schedule"),
    "view tasks, pause queues": ("view_task", "pause_queue"),
    "pause queues, no view": ("pause_queue",),
    "view tasks, change limits": ("view_task", "change_limits"),
    "change limits, no view": ("change_limits",),
}


def client_for(role: str) -> tuple[Client, User]:
    codenames = ROLES[role]
    username = role.replace(" ", "_").replace(",", "").replace(":", "")
    if codenames is None:
        user = User.objects.create_superuser(username, password="x")
    else:
        user = User.objects.create_user(username, password="x", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label=APP_LABEL, codename__in=codenames)
        )
    client = Client()
    client.force_login(user)
    return client, user


@pytest.mark.parametrize("role", list(ROLES))
def test_every_url_for_every_role(rows, role):
    """GET and POST on every admin URL of the app: no 500, and nothing hidden from a user who
    may not view it (403, or Django's own redirect)."""
    client, user = client_for(role)
    request = RequestFactory().get("/")
    request.user = user
    results, shown = [], []
    for route in admin_routes():
        urls = ([route.url(i) for i in stored_ids(route.model)] if route.per_object
                else [route.url()])
        for url in urls:
            for method in ("get", "post"):
                status = request_status(client, method, url, {"post": "yes"})
                results.append((f"{method} {url}", status))
                may_view = route.model is None or admin.site._registry[
                    route.model].has_view_permission(request)
                if not may_view and status == 200:
                    shown.append(f"{method} {url}")
    assert_no_500(results)
    assert shown == []


def test_a_user_who_is_not_staff_is_sent_to_the_login_page(rows):
    user = User.objects.create_user("visitor", password="x")
    client = Client()
    client.force_login(user)
    answers = set()
    for route in admin_routes():
        url = route.url(stored_ids(route.model)[0]) if route.per_object else route.url()
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            answers.add((response.status_code, response.get("Location", "").split("?")[0]))
    assert answers == {(302, "/admin/login/")}


def made_up(object_id: str) -> str:
    return object_id[:-1] + ("0" if object_id[-1] != "0" else "1")


@pytest.mark.parametrize("role", list(ROLES))
def test_without_view_a_real_id_and_a_made_up_one_answer_alike(rows, role):
    client, user = client_for(role)
    request = RequestFactory().get("/")
    request.user = user
    differences, results = [], []
    for route in admin_routes():
        if not route.per_object or admin.site._registry[route.model].has_view_permission(request):
            continue
        for real in stored_ids(route.model):
            for method in ("get", "post"):
                answers = []
                for object_id in (real, made_up(real)):
                    url = route.url(object_id)
                    try:
                        response = getattr(client, method)(url, {"post": "yes"})
                    except Exception as exc:  # noqa: BLE001 - a 500
                        results.append((f"{method} {url}", f"{type(exc).__name__}: {exc}"))
                        continue
                    location = response.get("Location", "").replace(object_id, "{id}")
                    answers.append((response.status_code, location))
                if len(answers) == 2 and answers[0] != answers[1]:
                    differences.append((method, route.path, answers))
    assert_no_500(results)
    assert differences == []
    # Nothing changed: not one task left its status.
    assert {t.status for t in Task.objects.filter(pk=rows["failed"].id)} == {"failed"}
    assert {t.status for t in Task.objects.filter(pk=rows["queued"].id)} == {"queued"}


def test_cancel_and_retry_need_view_permission(rows):
    client, _user = client_for("cancel and retry, no view")
    queued, failed = rows["queued"], rows["failed"]
    assert client.post(f"/admin/cairnq_django/task/{queued.id}/cancel/").status_code == 403
    assert client.post(f"/admin/cairnq_django/task/{failed.id}/retry/").status_code == 403
    assert client.post("/admin/cairnq_django/task/nonexistent/cancel/").status_code == 403
    assert Task.objects.get(pk=queued.id).status == "queued"
    assert Task.objects.get(pk=failed.id).status == "failed"

    allowed, _user = client_for("view tasks, cancel and retry")
    assert allowed.post(f"/admin/cairnq_django/task/{queued.id}/cancel/").status_code == 302
    assert allowed.post(f"/admin/cairnq_django/task/{failed.id}/retry/").status_code == 302
    assert Task.objects.get(pk=queued.id).status == "canceled"
    assert Task.objects.get(pk=failed.id).status == "queued"
    assert allowed.post("/admin/cairnq_django/task/nonexistent/cancel/").status_code == 404


# ------------------------------------------------------------ quoted links
# A foreign writer's ids: one that would climb out of the task admin, ones
# with the admin's own escape sequences in them.
ODD_IDS = ["../../../../admin/auth/user/add/?x=", "a_2Fb", "a_5Fb_", "x/y#z", "100%"]


def rename_task(old: str, new: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE cairnq_tasks SET root_id = %s WHERE root_id = %s", [new, old])
        cursor.execute("UPDATE cairnq_tasks SET id = %s WHERE id = %s", [new, old])


def assert_links_name_stored_objects(html: str, page_url: str, known: set[str]) -> None:
    """Every admin link on the page resolves to a page of this app, of an object that exists."""
    bad = []
    for path in links(html, page_url):
        if not path.startswith("/admin/"):
            continue
        try:
            match = resolve(path)
        except Resolver404:
            bad.append((path, "resolves to nothing"))
            continue
        if "object_id" in match.kwargs:
            object_id = unquote(match.kwargs["object_id"])
            if not path.startswith(f"/admin/{APP_LABEL}/") or object_id not in known:
                bad.append((path, object_id))
    assert bad == [], page_url


def test_links_from_stored_ids_are_quoted(admin_client, store):
    parent_ids = []
    for odd in ODD_IDS:
        parent = make(store, "running")
        rename_task(parent.id, odd)
        parent_ids.append(odd)
        child = store.submit("child")
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE cairnq_tasks SET parent_id = %s, root_id = %s WHERE id = %s",
                [odd, odd, child.id],
            )
        add_schedule_state(f"s-{len(parent_ids)}", last_task_id=odd)
    add_worker("w1")
    for odd in ODD_IDS:
        finished = make(store, "succeeded")
        rename_task(finished.id, odd + "-done")
    known = (set(Task.objects.values_list("id", flat=True)) | {"w1"}
             | set(ScheduleState.objects.values_list("name", flat=True)))

    pages = [f"/admin/cairnq_django/task/{t.id}/change/"
             for t in Task.objects.filter(parent_id__isnull=False)]
    pages += ["/admin/cairnq_django/task/", "/admin/cairnq_django/task/dashboard/",
              "/admin/cairnq_django/schedulestate/", "/admin/cairnq_django/workerrecord/w1/change/"]
    pages += [f"/admin/cairnq_django/task/{quote(odd)}/change/" for odd in ODD_IDS]
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        assert_links_name_stored_objects(response.content.decode(), url, known)

    # The purge confirmation lists the finished tasks it would delete.
    done = list(Task.objects.filter(status="succeeded").values_list("id", flat=True))
    response = admin_client.post("/admin/cairnq_django/task/",
                                 {"action": "purge_tasks", "_selected_action": done, "index": "0"})
    assert response.status_code == 200
    assert_links_name_stored_objects(response.content.decode(), "/admin/cairnq_django/task/",
                                     known)
