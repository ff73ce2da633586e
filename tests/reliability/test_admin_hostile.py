"""The task admin against rows Python cannot decode (issue 9).

Poison rows: a value the database stores but Python's JSON decoder refuses
(jsonb nested deeper than the decoder's recursion limit on PostgreSQL; TEXT
that is not UTF-8 on SQLite, which Python's sqlite3 cannot even fetch). The
admin must list such a task and show its raw text, never answer 500.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from cairnq_django.models import Task

from ..storeutil import run

CHANGELIST = "/admin/cairnq_django/task/"

# 5,000 levels: PostgreSQL's jsonb takes it, Python's json module does not.
DEEP_JSON = "[" * 5000 + "]" * 5000
# {"a":"<0xff>"}: SQLite stores it as TEXT (and json_valid accepts it), but it is not UTF-8.
BAD_UTF8_HEX = "7b2261223a22ff227d"
# {"html":"<script>alert(1)</script><0xff>"}
BAD_UTF8_SCRIPT_HEX = ('{"html":"<script>alert(1)</script>'.encode() + b'\xff"}').hex()

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


def finished_task(store, name="job"):
    task = run(store, name, priority=1_000_000)
    return store.complete(task.id, "w1", {"ok": True})


def failed_task(store, name="job"):
    task = run(store, name, priority=1_000_000, max_attempts=1)
    return store.fail(task.id, "w1", "boom", retryable=False)


# ---------------------------------------------------------------- poison rows
@pytest.mark.parametrize("column", JSON_COLUMNS)
def test_poison_row_is_listed_and_its_page_shows_the_raw_text(admin_client, store, column):
    makers = {"result": finished_task, "error": failed_task}
    task = makers.get(column, lambda store, name: store.submit(name))(store, "poisoned")
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
    task = failed_task(store, "poisoned")
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
    failed = failed_task(store, "f")
    done = finished_task(store, "d")
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
