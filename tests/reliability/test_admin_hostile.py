"""The admin against rows Python cannot decode and URLs nobody should send (issues 9, 21).

Two kinds of hostility:

- poison rows: a value the database stores but Python's JSON decoder refuses
  (jsonb nested deeper than the decoder's recursion limit on PostgreSQL; TEXT
  that is not UTF-8 on SQLite, which Python's sqlite3 cannot even fetch). The
  admin must list such a task and show its raw text, never answer 500.
- hostile requests: NUL bytes, huge values, unknown lookups, bad ordering and
  paging, odd ids, on every URL this app registers with the admin site (the
  tasks, workers and schedules admin and their own pages, found by walking the
  site's URL patterns: see admin_corpus.py). Anything may be a 400, a 403, a
  404 or a redirect; nothing may be a 500, and a JSON answer must be JSON.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from cairnq_django import pause_queue, set_limit
from cairnq_django.models import ScheduleState, Task, WorkerRecord
from cairnq_django.observability.overview import database_now_ms

from ..storeutil import make
from .admin_corpus import (
    admin_routes,
    assert_no_500,
    request_status,
    stored_ids,
    unfillable_routes,
)

CHANGELIST = "/admin/cairnq_django/task/"

# 5,000 levels: PostgreSQL's jsonb takes it, Python's json module does not.
DEEP_JSON = "[" * 5000 + "]" * 5000
# {"a":"<0xff>"}: SQLite stores it as TEXT (and json_valid accepts it), but it is not UTF-8.
BAD_UTF8_HEX = "7b2261223a22ff227d"
# {"html":"<script>alert(1)</script><0xff>"}
BAD_UTF8_SCRIPT_HEX = (b'{"html":"<script>alert(1)</script>' + b'\xff"}').hex()

JSON_COLUMNS = ("payload", "metadata", "result", "error")


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def poison(task_id: str, column: str = "payload", *, script: bool = False) -> None:
    """Overwrite one JSON column of a task with a value the database keeps but Python refuses."""
    with connection.cursor() as cursor:
        if is_postgres():
            value = DEEP_JSON
            if script:
                value = "[" * 5000 + '"<script>alert(1)</script>"' + "]" * 5000
            cursor.execute(
                f"UPDATE cairnq_tasks SET {column} = %s::jsonb WHERE id = %s", [value, task_id]
            )
        else:
            hex_text = BAD_UTF8_SCRIPT_HEX if script else BAD_UTF8_HEX
            cursor.execute(
                f"UPDATE cairnq_tasks SET {column} = cast(x'{hex_text}' as text) WHERE id = %s",
                [task_id],
            )


def detail_url(task_id: str) -> str:
    return reverse("admin:cairnq_django_task_change", args=[task_id])


def listed_ids(response) -> list[str]:
    return [task.id for task in response.context["cl"].result_list]


# ---------------------------------------------------------------- poison rows
@pytest.mark.parametrize("column", JSON_COLUMNS)
def test_poison_row_is_listed_and_its_page_shows_the_raw_text(admin_client, store, column):
    makers = {
        "result": lambda: make(store, "succeeded", "poisoned"),
        "error": lambda: make(store, "failed", "poisoned", max_attempts=1),
    }
    task = makers.get(column, lambda: make(store, "queued", "poisoned"))()
    healthy = store.submit("healthy")
    poison(task.id, column)

    listing = admin_client.get(CHANGELIST)
    assert listing.status_code == 200
    assert set(listed_ids(listing)) == {task.id, healthy.id}

    page = admin_client.get(detail_url(task.id))
    assert page.status_code == 200
    html = page.content.decode()
    assert "not valid JSON" in html
    if is_postgres():
        assert "[" * 5000 in html  # the raw text, as PostgreSQL prints it
    else:
        assert '{&quot;a&quot;:&quot;\ufffd&quot;}' in html  # the bad byte shown as U+FFFD
        assert "not valid UTF-8" in html


def test_every_json_column_poisoned_at_once(admin_client, store):
    task = make(store, "failed", "poisoned", max_attempts=1)
    for column in JSON_COLUMNS:
        poison(task.id, column)
    html = admin_client.get(detail_url(task.id)).content.decode()
    assert html.count("not valid JSON") == 4
    assert admin_client.get(CHANGELIST + f"?q={task.id}").status_code == 200


def test_poison_raw_text_is_escaped(admin_client, store):
    task = store.submit("poisoned")
    poison(task.id, script=True)
    html = admin_client.get(detail_url(task.id)).content.decode()
    assert "not valid JSON" in html
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_message_column_that_is_not_utf8(admin_client, store):
    if is_postgres():
        pytest.skip("PostgreSQL text is always valid in the server encoding")
    task = store.submit("poisoned")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE cairnq_tasks SET message = cast(x'6f6bff' as text) WHERE id = %s", [task.id]
        )
    assert admin_client.get(CHANGELIST).status_code == 200
    page = admin_client.get(detail_url(task.id))
    assert page.status_code == 200
    assert "ok\ufffd" in page.content.decode()


def test_lone_surrogate_in_a_json_string(admin_client, store):
    """Valid JSON whose string holds an unpaired surrogate cannot be written out as UTF-8."""
    if is_postgres():
        pytest.skip("jsonb refuses unpaired surrogates")
    task = store.submit("surrogate")
    with connection.cursor() as cursor:
        # The store refuses such a payload; a foreign writer need not.
        cursor.execute(
            "UPDATE cairnq_tasks SET payload = %s WHERE id = %s", [r'{"s":"\ud800"}', task.id]
        )
    page = admin_client.get(detail_url(task.id))
    assert page.status_code == 200
    assert "\\ud800" in page.content.decode()


def test_deep_but_decodable_json_is_shown(admin_client, store):
    """Deep enough to trouble a recursive pretty-printer, shallow enough for json.loads."""
    task = store.submit("deep")
    with connection.cursor() as cursor:
        cast = "%s::jsonb" if is_postgres() else "%s"
        cursor.execute(
            f"UPDATE cairnq_tasks SET payload = {cast} WHERE id = %s",
            ["[" * 900 + "]" * 900, task.id],
        )
    page = admin_client.get(detail_url(task.id))
    assert page.status_code == 200
    assert "[" * 900 in page.content.decode().replace("\n", "").replace(" ", "")


def test_actions_on_poison_rows(admin_client, store):
    queued = store.submit("q")
    failed = make(store, "failed", "f", max_attempts=1)
    done = make(store, "succeeded", "d")
    for task in (queued, failed, done):
        poison(task.id)
    for action, ids in (
        ("cancel_tasks", [queued.id]),
        ("retry_tasks", [failed.id]),
        ("purge_tasks", [done.id]),
    ):
        response = admin_client.post(
            CHANGELIST,
            {"action": action, "_selected_action": ids, "index": "0", "post": "yes"},
            follow=True,
        )
        assert response.status_code == 200, action
    statuses = dict(Task.objects.values_list("id", "status"))
    assert statuses == {queued.id: "canceled", failed.id: "queued"}


# -------------------------------------------------------- the accepted params
@pytest.mark.parametrize(
    "query",
    [
        "payload__contains=x",
        "name__regex=.*",
        "payload__a__b=1",
        "worker_id__startswith=x",
        "id__in=a,b",
        "keys__key=x",
        "keys__task__payload__contains=x",
        "status__isnull=True",
        "created_at_ms__gt=1",
        "pk=1",
        "message=x",
        "foo=bar",
    ],
)
def test_lookups_the_admin_does_not_offer_are_refused(admin_client, store, query):
    store.submit("job")
    response = admin_client.get(f"{CHANGELIST}?{query}")
    assert response.status_code == 400


@pytest.mark.parametrize(
    "query",
    [
        "status__exact=queued",
        "queue=default",
        "name=job",
        "root_id=x",
        "parent_id=x",
        "correlation_id=x",
        "q=job",
        "o=1",
        "o=-8",
        "p=1",
        "all=1",
        "_popup=1",
        "e=1",
    ],
)
def test_params_the_admin_offers_still_work(admin_client, store, query):
    store.submit("job")
    assert admin_client.get(f"{CHANGELIST}?{query}").status_code == 200


def test_nul_in_a_filter_is_a_bad_request(admin_client, store):
    store.submit("job")
    for query in ("name=%00", "queue=a%00b", "status__exact=%00", "root_id=%00", "q=%00"):
        assert admin_client.get(f"{CHANGELIST}?{query}").status_code == 400, query


def test_nul_in_a_task_id_is_not_found(admin_client, store):
    store.submit("job")
    for suffix in ("change/", "history/"):
        response = admin_client.get(f"{CHANGELIST}abc%00def/{suffix}")
        assert response.status_code == 302, suffix  # "doesn't exist", back to the index
    # Nobody may delete through the admin, so that page refuses before it looks.
    assert admin_client.get(f"{CHANGELIST}abc%00def/delete/").status_code == 403


def test_ordering_only_by_the_sortable_columns(admin_client, store):
    ids = [store.submit("job").id for _ in range(3)]
    default = listed_ids(admin_client.get(CHANGELIST))
    # Name the queues so that sorting by queue would reverse the default order.
    with connection.cursor() as cursor:
        for position, task_id in enumerate(default):
            cursor.execute(
                "UPDATE cairnq_tasks SET queue = %s WHERE id = %s", [f"q{9 - position}", task_id]
            )
    # Column 3 is the queue (0 is the action checkbox), which is not sortable:
    # the default order stays.
    for query in ("o=3", "o=-3", "o=2.3.4", "o=-5", "o=0"):
        response = admin_client.get(f"{CHANGELIST}?{query}")
        assert response.status_code == 200
        assert listed_ids(response) == default, query
    assert listed_ids(admin_client.get(CHANGELIST + "?o=1")) == sorted(ids)
    assert listed_ids(admin_client.get(CHANGELIST + "?o=3.1")) == sorted(ids)
    assert listed_ids(admin_client.get(CHANGELIST + "?o=-8")) == sorted(ids, reverse=True)


# ------------------------------------------------------ the hostile corpus
HUGE = "x" * 100_000

HOSTILE_QUERIES = [
    "name=%00", "queue=%00", "status__exact=%00", "root_id=%00", "parent_id=%00",
    "correlation_id=%00", "q=%00", "o=%00", "p=%00", "e=%00", "all=%00", "%00=1", "_popup=%00",
    "payload__contains=x", "name__regex=.*", "payload__a__b=1", "worker_id__startswith=x",
    "id__in=a,b", "keys__key=x", "keys__task__payload__contains=x", "pk=1",
    "status__isnull=True", "status__isnull=abc", "created_at_ms__gt=abc", "foo=bar",
    "_to_field=payload", "_to_field=id", "_to_field=%00", "_popup=1", "_facets=1", "e=1",
    "all=1", "all=",
    "o=999", "o=-999", "o=abc", "o=2", "o=-4", "o=--1", "o=-0", "o=0-", "o=.", "o=" + "0." * 500,
    "o=" + "9" * 5000, "o=%D9%A0",
    "p=-1", "p=abc", "p=0", "p=999999", "p=" + "9" * 5000, "p=1.5", "p=%00", "p=1e3",
    "name=" + HUGE, "q=" + HUGE, "root_id=" + HUGE, "status__exact=" + HUGE,
    "q=%F0%9F%92%A9", "name=%E2%80%AE", "name=%FF%FE", "q=%ED%A0%80", "name=%C0%80",
    "queue=%F0%9F%92%A9",
    "name=a&name=b", "status__exact=bogus", "queue=", "name=", "q=", "q=%20%20",
    "q=%27%20OR%201%3D1%20--", "name=%27%3B%20DROP%20TABLE%20cairnq_tasks%3B--",
    "q=%3Cscript%3Ealert(1)%3C%2Fscript%3E",
    "_changelist_filters=name%3D%2500", "_changelist_filters=" + HUGE,
    # The workers and schedules columns (issue 21).
    "host__regex=[]", "queues__contains=x", "host=%00", "id__regex=(a%2B)%2B%24", "host=" + HUGE,
    "pid__gt=abc", "last_seen_ms__gte=1", "queues__0=x", "paused__exact=1", "cursor_ms=1",
    "schedule=%00", "action=run",
    "&".join(f"f{i}=1" for i in range(1100)),
]

# Already percent-encoded path segments.
HOSTILE_IDS = [
    "nonexistent", "abc%00def", "%00", "a/b", "a%2Fb", "..%2F..%2Fadmin", "_00", "_2F", "_",
    "%25", "%25%25", "%FF", "%ED%A0%80", "%F0%9F%92%A9", "%E2%80%AE", "x" * 10_000, "%20", "1",
    "-1", "task_" + "0" * 26, "%27%20OR%201%3D1%20--", "%3Cscript%3E", "a%3Fb%3Dc", "a%23b",
]

@pytest.fixture
def corpus_tasks(store):
    """A queued, a running, a failed and a finished task, two of them poisoned; the running
    one held by a live worker (so the dashboard lists it), a schedule's state row and a
    paused queue's and a runtime flow limit's."""
    queued = store.submit("job", key="k1", correlation_id="c1")
    running = make(store, "running")
    failed = make(store, "failed", max_attempts=1)
    done = make(store, "succeeded")
    poison(queued.id)
    poison(done.id, "result")
    add_worker("w1")
    add_schedule_state("nightly", last_task_id=done.id)
    pause_queue("default", by="corpus")
    set_limit("name", "job", concurrency=2, by="corpus")
    add_workflow()
    return [queued.id, running.id, failed.id, done.id]


def add_workflow() -> str:
    """A workflow of two steps, one released (its task queued) and one waiting on it."""
    from cairnq_django import Workflow

    wf = Workflow("corpus <b>")
    first = wf.add("first", "job", {"html": "<script>"})
    wf.add("second", "job", after=first)
    return wf.enqueue().id


def add_worker(worker_id: str) -> WorkerRecord:
    now = database_now_ms("default")
    return WorkerRecord.objects.create(
        id=worker_id, host="web-1", pid=321, queues=["default"], concurrency=8, version="0.1.0",
        started_at_ms=now - 3_600_000, last_seen_ms=now, interval_ms=10_000,
    )


def add_schedule_state(name: str, last_task_id: str | None = None) -> ScheduleState:
    now = database_now_ms("default")
    return ScheduleState.objects.create(
        name=name, cursor_ms=now, last_task_id=last_task_id,
        last_enqueued_at_ms=now if last_task_id else None, created_at_ms=now, updated_at_ms=now,
    )


def test_every_route_is_fillable():
    """A route the corpus cannot fill in would go untested: teach admin_corpus its shape."""
    assert unfillable_routes() == []


def test_the_corpus_reaches_every_page_of_the_app():
    """The walk finds the pages known today (a page added later joins without being listed)."""
    found = {route.path for route in admin_routes()}
    for model in ("task", "workerrecord", "schedulestate", "queuestate", "flowlimit"):
        for suffix in ("", "add/", "{id}/", "{id}/change/", "{id}/history/", "{id}/delete/"):
            assert f"cairnq_django/{model}/{suffix}" in found
    for page in ("stats/", "dashboard/", "{id}/cancel/", "{id}/retry/", "{id}/progress/"):
        assert f"cairnq_django/task/{page}" in found
    assert "cairnq_django/queuestate/pause/" in found
    assert "cairnq_django/flowlimit/set/" in found
    assert {"", "cairnq_django/"} <= found


def first_ids() -> dict[type, str]:
    """One stored row's id (quoted for a URL) per model admin, for the query-string corpus."""
    return {route.model: ids[0] for route in admin_routes()
            if route.model is not None and (ids := stored_ids(route.model))}


def test_hostile_query_strings_on_every_url(admin_client, corpus_tasks):
    ids = first_ids()
    results = []
    for route in admin_routes():
        url = route.url(ids[route.model]) if route.per_object else route.url()
        for query in HOSTILE_QUERIES:
            target = f"{url}?{query}"
            results.append((target, request_status(admin_client, "get", target)))
    assert_no_500(results)


def test_hostile_ids_on_every_object_url(admin_client, corpus_tasks):
    results = []
    for route in admin_routes():
        if not route.per_object:
            continue
        for object_id in HOSTILE_IDS + stored_ids(route.model):
            url = route.url(object_id)
            results.append((url, request_status(admin_client, "get", url)))
            if not route.path.endswith("{id}/"):
                results.append(("POST " + url, request_status(admin_client, "post", url,
                                                              {"post": "yes", "name": "x"})))
    assert_no_500(results)


HOSTILE_SELECTIONS = [
    ["\x00"], ["abc\x00def"], ["x" * 100_000], ["nonexistent"], ["\U0001f4a9"],
    ["' OR 1=1 --"], [""],
    [f"id{i}" for i in range(999)],
]


def test_hostile_action_posts(admin_client, corpus_tasks):
    actions = ["cancel_tasks", "retry_tasks", "retry_tasks_reset", "purge_tasks",
               "delete_selected", "bogus", "", "\x00"]
    selections = [*HOSTILE_SELECTIONS, corpus_tasks, []]
    results = []
    for action in actions:
        for selected in selections:
            for extra in ({"index": "0"}, {"index": "abc", "select_across": "1"},
                          {"index": "-1", "post": "yes"}, {"index": "999", "select_across": "x"},
                          {"index": "0", "post": "yes", "select_across": "1"}):
                data = {"action": action, "_selected_action": selected, **extra}
                where = f"POST {action!r} {str(selected)[:60]} {extra}"
                results.append((where, request_status(admin_client, "post", CHANGELIST, data)))
    # The confirmation posts of a filtered list, with hostile filters on the URL.
    for query in HOSTILE_QUERIES[:40]:
        data = {"action": "purge_tasks", "_selected_action": corpus_tasks, "index": "0"}
        url = f"{CHANGELIST}?{query}"
        results.append((f"POST purge {url}", request_status(admin_client, "post", url, data)))
    too_many = {"action": "cancel_tasks", "_selected_action": [f"id{i}" for i in range(1100)]}
    results.append(("POST 1100 ids", request_status(admin_client, "post", CHANGELIST, too_many)))
    results.append(("POST stats", request_status(admin_client, "post", CHANGELIST + "stats/")))
    assert_no_500(results)

