"""Each of the admin's own pages laid out as Django's own, on whichever Django runs the test.

Run under Django 5.2 (the default venv) and 6.1 (`scripts/tox -e py312-dj61-sqlite --
tests/test_admin_layout_browser.py`): 6.1 changed the breadcrumbs' markup and styles
(<ol class="breadcrumbs"> with <li> items; 5.2 and 6.0 use <div class="breadcrumbs">), so a page
that hard-codes one version's markup shows unstyled breadcrumbs on the other. Every page is
compared with a page of Django's own (the users list) in the same browser: the breadcrumbs
container's tag, colours, padding, position and one-line height, the heading's style, and no
sideways scrolling at 1,400 px. Screenshots go to artifacts/admin-pages/django-X.Y/.
"""

from __future__ import annotations

from datetime import timedelta

import django
import pytest
from django.utils.text import capfirst

from cairnq_django import compat
from cairnq_django.models import FlowLimit, QueueState, ScheduleState, WorkerRecord

from .storeutil import run
from .test_admin_browser import (
    ARTIFACTS,
    _login,
    _make,
    _user,
    browser,  # noqa: F401  (the fixture)
)

WIDTH = 1400
SHOTS = ARTIFACTS / "admin-pages" / f"django-{django.VERSION[0]}.{django.VERSION[1]}"

# The breadcrumbs container and the first heading, measured the same way on every page.
MEASURE_JS = """
() => {
    const crumbs = document.querySelectorAll('nav > .breadcrumbs');
    const box = crumbs.length ? crumbs[0] : null;
    const style = box ? getComputedStyle(box) : null;
    const rect = box ? box.getBoundingClientRect() : null;
    const links = box ? Array.from(box.querySelectorAll('a')) : [];
    const heading = document.querySelector('#content h1');
    return {
        count: crumbs.length,
        tag: box ? box.tagName : null,
        background: style && style.backgroundColor,
        color: style && style.color,
        paddingLeft: style && style.paddingLeft,
        listStyle: style && style.listStyleType,
        left: rect && Math.round(rect.left),
        width: rect && Math.round(rect.width),
        height: rect && Math.round(rect.height),
        tops: Array.from(new Set(links.map((link) => Math.round(link.getBoundingClientRect().top)))),
        // The current page: the last <li> (6.1), or the text after the last "›" (5.2, 6.0).
        last: !box ? null : box.tagName === 'OL'
            ? box.querySelector('li:last-child').innerText.trim()
            : box.innerText.split('\\u203a').pop().trim(),
        headingSize: heading && getComputedStyle(heading).fontSize,
        headingWeight: heading && getComputedStyle(heading).fontWeight,
        scrollWidth: document.documentElement.scrollWidth,
        clientWidth: document.documentElement.clientWidth,
    };
}
"""


def _measure(page, path: str, ready: str):
    page.goto(path)
    page.wait_for_selector(ready)
    return page.evaluate(MEASURE_JS)


def _assert_laid_out_like_django(found: dict, reference: dict, last: str) -> None:
    # One breadcrumbs container, inside Django's <nav>, in this version's markup.
    assert found["count"] == 1, found
    assert found["tag"] == reference["tag"] == ("OL" if compat.ADMIN_BREADCRUMBS_AS_LIST else "DIV")
    # Styled by Django's stylesheet exactly as Django's own page is.
    for prop in ("background", "color", "paddingLeft", "listStyle", "left", "width", "height"):
        assert found[prop] == reference[prop], (prop, found, reference)
    # The links on one line, where Django's own are (an unstyled <ol> stacks its items),
    # and the trail ends with this page's name.
    assert found["tops"] == reference["tops"] and len(found["tops"]) == 1, (found, reference)
    assert found["last"] == last, found
    if reference["headingSize"] and found["headingSize"]:
        assert (found["headingSize"], found["headingWeight"]) == (
            reference["headingSize"], reference["headingWeight"]
        )
    # No sideways scrolling at 1,400 px.
    assert found["scrollWidth"] <= found["clientWidth"] == WIDTH, found


PLACEHOLDERS_JS = """
() => Array.from(document.querySelectorAll('#cq-limit-form input[placeholder]')).map((input) => {
    const typed = getComputedStyle(input), hint = getComputedStyle(input, '::placeholder');
    return {name: input.name, text: input.placeholder, value: input.value,
            typedColor: typed.color, hintColor: hint.color, hintStyle: hint.fontStyle,
            hintOpacity: hint.opacity};
})
"""


def _assert_placeholders_look_empty(page) -> None:
    """The limit form's hints read as examples, and look unlike a typed value."""
    hints = page.evaluate(PLACEHOLDERS_JS)
    assert {hint["name"] for hint in hints} == {"value", "concurrency", "rate", "per"}
    for hint in hints:
        assert hint["value"] == "" and hint["text"].startswith("e.g. "), hint
        assert hint["hintStyle"] == "italic", hint
        assert hint["hintColor"] != hint["typedColor"] or float(hint["hintOpacity"]) < 1, hint


@pytest.mark.slow
def test_every_admin_page_of_ours_is_laid_out_as_djangos_own(
    browser, live_server, live_store, settings  # noqa: F811
):
    store = live_store
    settings.CAIRNQ = {"SCHEDULE": {
        "nightly-invoice-summary": {"task": "reports.build_monthly_invoice_summary",
                                    "cron": "0 3 * * *", "timezone": "Europe/Paris"},
        "poll-feeds": {"task": "feeds.poll", "every": timedelta(minutes=5)},
    }}
    failed = _make(store, "failed", "emails.send_password_reset", max_attempts=1)
    _make(store, "succeeded", "reports.build_monthly_invoice_summary", key="report-2026-11-eu-west")
    for queue in ("default", "emails", "imports-bulk"):
        _make(store, "queued", "emails.send", queue=queue, key=f"order-{queue}-40917")
    # A task snoozed once and running again: its attempt cell reads "1/3", then "1 snoozed".
    name = "shop.charge_card_with_retries"
    snoozed = run(store, name, max_attempts=3)
    store.snooze(snoozed.id, "w1", 1)
    claimed: list = []
    while not claimed:  # due a millisecond later
        claimed = store.claim(queues=["default"], worker_id="w1", names=[name])
    assert (claimed[0].id, claimed[0].attempt) == (snoozed.id, 1)
    _user("root", superuser=True)

    page = _login(browser, live_server, "root")
    page.set_viewport_size({"width": WIDTH, "height": 900})
    base = live_server.url
    reference = _measure(page, f"{base}/admin/auth/user/", "#result_list")
    assert reference["count"] == 1 and reference["last"] == "Users", reference

    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "django-users-list.png"), full_page=True)
    def plural(model) -> str:
        return capfirst(model._meta.verbose_name_plural)

    pages = [
        ("task-list", "/admin/cairnq_django/task/", "#result_list", "Tasks"),
        ("task-page", f"/admin/cairnq_django/task/{failed.id}/change/", "#content-main",
         f"{failed.name} {failed.id}"),
        ("dashboard", "/admin/cairnq_django/task/dashboard/", "#content-main", "Dashboard"),
        ("queue-stats", "/admin/cairnq_django/task/stats/", "#cq-counts", "Queue stats"),
        ("schedules", "/admin/cairnq_django/schedulestate/", "#cq-schedules", plural(ScheduleState)),
        ("workers", "/admin/cairnq_django/workerrecord/", "#content-main", plural(WorkerRecord)),
        ("queues", "/admin/cairnq_django/queuestate/", "#content-main", plural(QueueState)),
        ("flow-limits", "/admin/cairnq_django/flowlimit/", "#content-main", plural(FlowLimit)),
    ]
    for name, path, ready, last in pages:
        found = _measure(page, base + path, ready)
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
        _assert_laid_out_like_django(found, reference, last)
        if name == "dashboard":
            _assert_placeholders_look_empty(page)
        if name == "task-list":
            attempts = page.locator("#result_list td.field-attempts").all_inner_texts()
            print(attempts)
            # The list fits its column: Django 6.1 scrolls an over-wide list inside the page
            # (so the page itself does not overflow), cutting its last columns off.
            # Measured at its narrowest (min-content), so a list that only just fits fails too.
            table, column = page.evaluate(
                "() => { const t = document.querySelector('#result_list'); t.style.width = 'min-content';"
                " const sizes = [t.getBoundingClientRect().width, t.parentElement.clientWidth];"
                " t.style.width = ''; return sizes; }"
            )
            assert table <= column, (table, column)

    # The purge confirmation, reached through the action as an operator does.
    page.goto(f"{base}/admin/cairnq_django/task/")
    page.check(f'input.action-select[value="{failed.id}"]')
    page.select_option("select[name=action]", "purge_tasks")
    with page.expect_navigation():
        page.click("button[name=index]")
    page.wait_for_selector(".cq-purge-count")
    found = page.evaluate(MEASURE_JS)
    page.screenshot(path=str(SHOTS / "purge-confirmation.png"), full_page=True)
    _assert_laid_out_like_django(found, reference, "Purge finished tasks")
    page.close()
