"""The dashboard's flow limits panel and its set/clear form (admin/flow_limit_admin.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth.models import User
from django.test import Client

from cairnq_django import effective_limits, enqueue, set_limit
from cairnq_django.models import FlowLimit
from tests.test_schedule_admin import messages_of, staff

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/cairnq_django/task/dashboard/"
SET = "/admin/cairnq_django/flowlimit/set/"
LIST = "/admin/cairnq_django/flowlimit/"


def limits() -> dict[tuple[str, str], tuple]:
    return {(x.scope, x.value): (x.concurrency, x.rate, x.per_ms, x.source)
            for x in effective_limits()}


def post(client, **data):
    return client.post(SET, data, follow=True)


@pytest.fixture
def limited(settings, store):
    settings.CAIRNQ = {"LIMITS": [
        {"name": "reports.generate", "concurrency": 3},
        {"key_prefix": "account:", "concurrency": 1},
        {"queue": "partner", "rate": 20, "per": timedelta(minutes=1)},
    ]}
    for _ in range(4):
        enqueue("reports.generate", {})
    claimed = store.claim_limited(
        limits=effective_limits(), queues=["default"], worker_id="w1", limit=8
    ).tasks
    assert len(claimed) == 3  # the fourth is held back
    for _ in range(2):
        enqueue("accounts.sync", {}, queue="accounts", concurrency_key="account:7")
    (running,) = store.claim_limited(
        limits=effective_limits(), queues=["accounts"], worker_id="w1", limit=1
    ).tasks
    # After the claim: tasks enqueued in one millisecond are claimed in id order.
    enqueue("accounts.sync", {}, queue="accounts", concurrency_key="account:8")
    return running


def test_the_panel_shows_each_limit_and_its_use(admin_client, limited):
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'id="cq-limits"' in page
    name_row = page.split('data-scope="name" data-value="reports.generate"')[1].split("</tr>")[0]
    assert 'class="cq-limit-full"' in name_row
    assert "settings" in name_row and "3 running" in name_row
    assert '<td class="cq-num cq-limit-running cq-limit-at">3/3' in name_row
    assert '<td class="cq-num cq-limit-held">1</td>' in name_row
    key_row = page.split('data-scope="key_prefix" data-value="account:"')[1].split("</tr>")[0]
    assert "1/1" in key_row and "1 key at the limit" in key_row
    assert "busiest <code>account:7</code>" in key_row
    assert '<td class="cq-num cq-limit-held">1</td>' in key_row  # account:7's second task
    rate_row = page.split('data-scope="queue" data-value="partner"')[1].split("</tr>")[0]
    assert "0/20 per 1m" in rate_row
    # A superuser sees the form; settings limits have no Clear button (only runtime ones).
    assert 'id="cq-limit-form"' in page and f'action="{SET}"' in page
    assert "cq-limit-clear" not in page


def test_without_limits_the_panel_says_so(admin_client, store):
    page = admin_client.get(DASHBOARD).content.decode()
    assert 'id="cq-no-limits"' in page and 'id="cq-limits"' not in page


def test_setting_and_clearing_a_limit_is_logged(admin_client, store):
    response = post(admin_client, action="set", scope="name", value="reports.generate",
                    concurrency="3", rate="", per="")
    assert response.redirect_chain[-1][0] == DASHBOARD + "#cq-limits"
    assert messages_of(response) == ["Limited task name “reports.generate” to 3 running."]
    assert limits() == {("name", "reports.generate"): (3, None, None, "runtime")}
    row = FlowLimit.objects.get()
    assert row.changed_by == "admin"
    entry = LogEntry.objects.get()
    assert (entry.object_repr, entry.action_flag, entry.user.username) == (
        "name reports.generate", CHANGE, "admin"
    )
    assert "3 running" in entry.get_change_message()
    page = response.content.decode()
    assert "cq-limit-clear" in page  # a runtime limit can be cleared from its row

    post(admin_client, action="set", scope="key_prefix", value="account:", concurrency="1",
         rate="5", per="1m")
    assert limits()[("key_prefix", "account:")] == (1, 5, 60_000, "runtime")

    response = post(admin_client, action="clear", scope="name", value="reports.generate")
    assert messages_of(response) == ["Cleared the runtime limit on task name “reports.generate”."]
    assert ("name", "reports.generate") not in limits()
    deletion = LogEntry.objects.filter(action_flag=DELETION).get()
    assert deletion.object_repr == "name reports.generate"
    response = post(admin_client, action="clear", scope="name", value="reports.generate")
    assert messages_of(response) == ["There was no runtime limit on task name “reports.generate”."]
    assert LogEntry.objects.count() == 3
    assert not LogEntry.objects.filter(action_flag=ADDITION).exists()


def test_a_runtime_limit_over_a_settings_one_and_back(admin_client, limited):
    post(admin_client, action="set", scope="name", value="reports.generate", concurrency="5")
    assert limits()[("name", "reports.generate")] == (5, None, None, "runtime")
    page = admin_client.get(DASHBOARD).content.decode()
    row = page.split('data-value="reports.generate"')[1].split("</tr>")[0]
    assert "runtime" in row and "3/5" in row and "cq-limit-clear" in row
    post(admin_client, action="clear", scope="name", value="reports.generate")
    assert limits()[("name", "reports.generate")] == (3, None, None, "settings")


def test_get_never_changes_anything(admin_client, store):
    response = admin_client.get(SET, {"action": "set", "scope": "name", "value": "x",
                                      "concurrency": "1"})
    assert response.status_code == 405
    assert not FlowLimit.objects.exists()


def test_without_the_permission_there_is_no_form_and_the_post_is_refused(client, limited):
    client.force_login(staff("view_task"))
    page = client.get(DASHBOARD).content.decode()
    assert 'id="cq-limits"' in page  # the panel is for everyone who sees the dashboard
    assert 'id="cq-limit-form"' not in page and "cq-limit-clear" not in page
    response = client.post(SET, {"action": "set", "scope": "name", "value": "x",
                                 "concurrency": "1"})
    assert response.status_code == 403
    set_limit("name", "y", concurrency=1)
    response = client.post(SET, {"action": "clear", "scope": "name", "value": "y"})
    assert response.status_code == 403
    assert list(FlowLimit.objects.values_list("value", flat=True)) == ["y"]
    assert not LogEntry.objects.exists()


def test_the_permission_alone_is_enough(client, store):
    client.force_login(staff("view_task", "change_limits"))
    assert 'id="cq-limit-form"' in client.get(DASHBOARD).content.decode()
    response = client.post(SET, {"action": "set", "scope": "queue", "value": "partner",
                                 "rate": "20", "per": "1s"})
    assert response.status_code == 302
    assert limits() == {("queue", "partner"): (None, 20, 1000, "runtime")}


def test_the_pause_permission_does_not_change_limits(client, store):
    client.force_login(staff("view_task", "pause_queue"))
    response = client.post(SET, {"action": "set", "scope": "queue", "value": "q",
                                 "concurrency": "1"})
    assert response.status_code == 403


def test_the_post_needs_its_csrf_token(store):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root2", password="x"))
    response = client.post(SET, {"action": "set", "scope": "name", "value": "x",
                                 "concurrency": "1"})
    assert response.status_code == 403
    assert not FlowLimit.objects.exists()


@pytest.mark.parametrize("data, message", [
    ({"action": "set", "scope": "name", "value": "x"}, "Give a concurrency, a rate or both."),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "0"}, "concurrency"),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "-1"}, "whole number"),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "1.5"}, "whole number"),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "٣"}, "whole number"),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "9" * 40}, "whole number"),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "2147483648"}, "at most"),
    ({"action": "set", "scope": "name", "value": "x", "rate": "1e3"}, "whole number"),
    ({"action": "set", "scope": "name", "value": "x", "rate": "5", "per": "soon"},
     "not a duration"),
    ({"action": "set", "scope": "name", "value": "x", "rate": "5", "per": "0"}, "per"),
    ({"action": "set", "scope": "name", "value": "x", "rate": "5", "per": "9" * 40}, "per"),
    ({"action": "set", "scope": "name", "value": "x", "rate": "5", "per": "99999999999999w"},
     "per"),
    ({"action": "set", "scope": "name", "value": "x", "concurrency": "1", "per": "1s"},
     "give a rate"),
    ({"action": "set", "scope": "name", "value": "", "concurrency": "1"}, "non-empty"),
    ({"action": "set", "scope": "name", "value": "x" * 256, "concurrency": "1"}, "at most 255"),
    ({"action": "set", "scope": "planet", "value": "x", "concurrency": "1"},
     "Choose a queue, a task name or a key prefix."),
    ({"action": "set", "value": "x", "concurrency": "1"},
     "Choose a queue, a task name or a key prefix."),
    ({"action": "explode", "scope": "name", "value": "x"}, "Unknown action."),
    ({"action": "clear", "scope": "name", "value": ""}, "There was no runtime limit"),
])
def test_bad_posts_are_messages_not_errors(admin_client, store, data, message):
    response = post(admin_client, **data)
    assert response.status_code == 200
    assert any(message in text for text in messages_of(response)), messages_of(response)
    assert not FlowLimit.objects.exists()
    assert not LogEntry.objects.exists()


def test_nul_is_refused_before_anything(admin_client, store):
    response = admin_client.post(SET, {"action": "set", "scope": "name", "value": "a\x00b",
                                       "concurrency": "1"})
    assert response.status_code == 400
    assert not FlowLimit.objects.exists()


def test_a_hostile_value_is_escaped_everywhere(admin_client, store):
    value = '<script>alert("v")</script>'
    enqueue("tests.echo", {}, queue="accounts", concurrency_key=value + "1")
    response = post(admin_client, action="set", scope="key_prefix", value=value,
                    concurrency="1")
    page = response.content.decode()
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;v&quot;)&lt;/script&gt;" in page
    assert limits()[("key_prefix", value)][0] == 1
    page = admin_client.get(LIST).content.decode()
    assert "<script>alert" not in page and "&lt;script&gt;" in page


def test_the_runtime_limits_list_is_read_only(admin_client, store):
    set_limit("name", "reports.generate", concurrency=2, by="alice")
    set_limit("name", "lifted.one", by="bob")
    page = admin_client.get(LIST).content.decode()
    assert "reports.generate" in page and "alice" in page and "2 running" in page
    assert "none (lifts the settings" in page
    assert admin_client.get(LIST + "add/").status_code == 403
    row = FlowLimit.objects.get(value="reports.generate")
    assert admin_client.post(f"{LIST}{row.pk}/delete/").status_code == 403
    assert FlowLimit.objects.count() == 2


HOSTILE_TEXT = ["", " ", "\U0001f4a9", "x" * 100_000, "' OR 1=1 --", "<b>", "-0", "0x10",
                "1_000", "１２", "NaN", "inf", "1e400", "9" * 400, "2147483647", "1.0"]


def test_hostile_form_posts_never_fail(admin_client, store):
    from tests.reliability.admin_corpus import assert_no_500, request_status

    results = []
    for scope in ("queue", "name", "key_prefix", "", "bogus"):
        for text in HOSTILE_TEXT:
            for data in (
                {"action": "set", "scope": scope, "value": text, "concurrency": "2"},
                {"action": "set", "scope": scope, "value": "v", "concurrency": text},
                {"action": "set", "scope": scope, "value": "v", "rate": text, "per": "1s"},
                {"action": "set", "scope": scope, "value": "v", "rate": "3", "per": text},
                {"action": "clear", "scope": scope, "value": text},
                {"action": text, "scope": scope, "value": "v"},
            ):
                results.append((f"POST {data!r:.120}",
                                request_status(admin_client, "post", SET, data)))
    results.append(("POST lists", request_status(admin_client, "post", SET, {
        "action": ["set", "clear"], "scope": ["name", "queue"], "value": ["a", "b"],
        "concurrency": ["1", "2"]})))
    assert_no_500(results)
    # Whatever was accepted is a valid limit.
    for row in FlowLimit.objects.all():
        assert row.concurrency is None or 1 <= row.concurrency <= 2**31 - 1
        assert row.per_ms is None or row.per_ms >= 1


def test_invalid_limit_settings_are_said_on_the_dashboard_not_a_500(admin_client, store, settings):
    settings.CAIRNQ = {"LIMITS": [{"name": "<b>x</b>", "concurrency": 0}]}
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="cq-limits-error"' in page and "concurrency" in page
    assert "<b>x</b>" not in page


def test_the_forms_hints_are_examples_not_values(admin_client, store):
    """Placeholders that read like typed values ("3", "20") made empty fields look filled."""
    import re

    html = admin_client.get(DASHBOARD).content.decode()
    form = html[html.index('id="cq-limit-form"'):html.index("</form>", html.index('id="cq-limit-form"'))]
    hints = re.findall(r'placeholder="([^"]*)"', form)
    assert len(hints) == 4
    assert all(hint.startswith("e.g. ") for hint in hints), hints
    assert not re.search(r'<input type="(?:text|number)"[^>]*\svalue=', form)
