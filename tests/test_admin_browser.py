"""The task admin in a real browser: headless Chromium driven by Playwright.

Needs Debian's `chromium` package (/usr/bin/chromium) and the `playwright`
Python package; Playwright's own browser download is never used. Without them
the test is skipped, unless CAIRNQ_REQUIRE_BROWSER=1 makes that a failure (CI).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections

from .storeutil import run

CHROMIUM = os.environ.get("CAIRNQ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
PASSWORD = "correct horse battery staple"


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@pytest.fixture
def browser(monkeypatch):
    missing = _browser_missing()
    if missing:
        if os.environ.get("CAIRNQ_REQUIRE_BROWSER") == "1":
            pytest.fail(f"The browser test cannot run: {missing}.")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the test's own
    # ORM calls are still synchronous and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()
            # Django keys connections by context, and Playwright's loop gives
            # the test its own; close it so the test database can be dropped.
            connections.close_all()


def _user(username: str, *codenames: str, superuser: bool = False) -> User:
    user = User.objects.create_user(
        username, password=PASSWORD, is_staff=True, is_superuser=superuser
    )
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="cairnq_django", codename__in=codenames)
    )
    return user


def _login(browser, live_server, username: str):
    page = browser.new_page(viewport={"width": 1920, "height": 1000})
    page.set_default_timeout(30_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/cairnq_django/task/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#changelist")
    return page


def _run_action(page, action: str, task_ids: list[str]) -> None:
    for task_id in task_ids:
        page.check(f'input.action-select[value="{task_id}"]')
    page.select_option("select[name=action]", action)
    with page.expect_navigation():
        page.click("button[name=index]")


def _messages(page) -> list[str]:
    return [text.strip() for text in page.locator("ul.messagelist li").all_inner_texts()]


def _make(store, status: str, name: str, queue: str = "default", **submit):
    if status == "queued":
        return store.submit(name, queue=queue, **submit)
    task = run(store, name, queue=queue, priority=1_000_000, **submit)
    if status == "running":
        store.progress(task.id, "w1", 0.6, "two thirds through the import")
        return store.get(task.id)
    if status == "succeeded":
        return store.complete(task.id, "w1", {"rows": 120})
    if status == "failed":
        return store.fail(task.id, "w1", "upstream said 503", retryable=False)
    raise ValueError(status)


@pytest.mark.slow
def test_operator_filters_and_runs_every_action(browser, live_server, live_store):
    store = live_store
    succeeded = _make(store, "succeeded", "reports.build", queue="reports", key="report-2026-11")
    failed = _make(store, "failed", "emails.send", queue="mail", max_attempts=1)
    running = _make(store, "running", "imports.csv", queue="imports")
    queued = _make(store, "queued", "emails.send", queue="mail", correlation_id="req-1")
    other = _make(store, "queued", "emails.send", queue="mail")
    _user("root", superuser=True)

    page = _login(browser, live_server, "root")

    # The changelist, with badges and the progress bar, kept as an artifact.
    assert page.locator("#result_list tbody tr").count() == 5
    assert page.locator(".cq-status-running").count() == 1
    assert page.locator("progress.cq-progress").count() == 1
    assert "report-2026-11" in page.inner_text("#result_list")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-changelist.png"), full_page=True)

    # Filter by status, then by queue, through the sidebar links.
    page.click('#changelist-filter a[href*="status__exact=failed"]')
    page.wait_for_url("**status__exact=failed**")
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.locator(f'#result_list .cq-id[title="{failed.id}"]').count() == 1
    page.goto(f"{live_server.url}/admin/cairnq_django/task/")
    page.click('#changelist-filter a[href="?queue=mail"]')
    page.wait_for_url("**queue=mail**")
    assert page.locator("#result_list tbody tr").count() == 3

    # Search by correlation id.
    page.fill("#searchbar", "req-1")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=req-1**")
    assert page.locator("#result_list tbody tr").count() == 1

    page.goto(f"{live_server.url}/admin/cairnq_django/task/")
    _run_action(page, "cancel_tasks", [queued.id, running.id])
    assert _messages(page) == [
        "Canceled 1 queued task.",
        "Asked 1 running task to stop; it ends canceled when its worker notices.",
    ]
    assert store.get(queued.id).status == "canceled"
    assert store.get(running.id).cancel_requested_at_ms is not None

    _run_action(page, "retry_tasks", [failed.id])
    assert _messages(page) == ["Queued 1 task again."]
    assert (store.get(failed.id).status, store.get(failed.id).attempt) == ("queued", 1)

    _run_action(page, "retry_tasks_reset", [queued.id])
    assert _messages(page) == ["Queued 1 task again with its attempts reset."]
    assert store.get(queued.id).status == "queued"

    _run_action(page, "purge_tasks", [succeeded.id, other.id])
    page.wait_for_selector(".cq-purge-count")
    assert "1 finished task will be deleted" in page.inner_text("#content")
    assert "1 selected task is still queued or running" in page.inner_text("#content")
    with page.expect_navigation():
        page.click("input[type=submit][value='Yes, purge them']")
    assert _messages(page) == ["Purged 1 finished task."]
    assert store.get(succeeded.id) is None
    assert store.get(other.id).status == "queued"

    # The stats page is one click away.
    page.click("a.cq-stats-link")
    page.wait_for_selector("#cq-counts")
    assert "mail" in page.inner_text("#cq-counts")
    page.close()


@pytest.mark.slow
def test_actions_are_not_offered_without_their_permissions(browser, live_server, live_store):
    task = _make(live_store, "queued", "emails.send")
    _user("viewer", "view_task")
    _user("canceller", "view_task", "cancel_task")

    page = _login(browser, live_server, "viewer")
    assert page.locator("select[name=action]").count() == 0
    page.close()

    page = _login(browser, live_server, "canceller")
    options = page.locator("select[name=action] option").evaluate_all(
        "options => options.map(o => o.value).filter(Boolean)"
    )
    assert options == ["cancel_tasks"]
    _run_action(page, "cancel_tasks", [task.id])
    assert _messages(page) == ["Canceled 1 queued task."]
    page.close()


# Counts, for each cell of the given columns, the line boxes of its longest
# text: a text node broken over two lines ("defaul" / "t") has two rects.
WRAPPED_TEXT_JS = """
(columns) => columns.flatMap((column) =>
    Array.from(document.querySelectorAll(`#result_list td.field-${column}, #result_list th.field-${column}`))
        .map((cell) => {
            const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
            let lines = 0;
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
                if (!node.textContent.trim()) continue;
                const range = document.createRange();
                range.selectNodeContents(node);
                const tops = new Set(Array.from(range.getClientRects()).map((r) => Math.round(r.top)));
                lines = Math.max(lines, tops.size);
            }
            return {column, text: cell.innerText.trim(), lines};
        }))
"""


@pytest.mark.slow
def test_changelist_keeps_short_values_on_one_line_at_1400px(browser, live_server, live_store):
    store = live_store
    _make(store, "succeeded", "reports.build_monthly_invoice_summary", key="report-2026-11-eu-west")
    _make(store, "failed", "emails.send_password_reset", max_attempts=1)
    _make(store, "running", "imports.csv")
    for queue in ("default", "emails", "imports-bulk"):
        _make(store, "queued", "emails.send", queue=queue, key=f"order-{queue}-40917")
    _user("root", superuser=True)
    page = _login(browser, live_server, "root")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.reload()
    page.wait_for_selector("#result_list")

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-changelist-1400.png"), full_page=True)
    short = ["short_id", "queue_name", "status_badge", "attempts", "created", "duration"]
    cells = page.evaluate(WRAPPED_TEXT_JS, short)
    assert {cell["column"] for cell in cells} == set(short)
    wrapped = [cell for cell in cells if cell["lines"] > 1]
    assert wrapped == []
    # The list fits its column of the page: no sideways scrolling, nothing cut off.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    fits = page.evaluate(
        "() => { const t = document.querySelector('#result_list');"
        " return [t.getBoundingClientRect().width, t.parentElement.clientWidth]; }"
    )
    assert fits[0] <= fits[1], fits
    # The shortened id carries the full one, on hover and for the copy button.
    task_ids = {task.id for task in store.list(limit=10)}
    titles = set(page.locator("#result_list .field-short_id .cq-id").evaluate_all(
        "ids => ids.map(id => id.title)"))
    assert titles == task_ids
    copies = page.locator("#result_list .field-short_id button.cq-copy")
    assert set(copies.evaluate_all("buttons => buttons.map(b => b.dataset.copy)")) == task_ids
    # The button copies the full id (and stays on the list page).
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    first = copies.first
    first.click()
    page.wait_for_selector("button.cq-copy.cq-copied")
    assert page.evaluate("navigator.clipboard.readText()") == first.get_attribute("data-copy")
    assert page.url.endswith("/admin/cairnq_django/task/")
    page.close()


@pytest.mark.slow
def test_a_failed_tasks_page_shows_its_traceback_as_lines(browser, live_server, live_store):
    store = live_store
    task = run(store, "emails.send", max_attempts=1)
    trace = (
        "Traceback (most recent call last):\n"
        '  File "shop/tasks.py", line 12, in send\n'
        "    smtp.send(message)\n"
        "ConnectionError: upstream <smtp> timed out\n"
    )
    store.fail(task.id, "w1", {
        "type": "ConnectionError", "code": "handler_error", "message": "upstream <smtp> timed out",
        "details": {"traceback": trace},
    }, retryable=False)
    _user("root", superuser=True)
    page = _login(browser, live_server, "root")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/cairnq_django/task/{task.id}/change/")

    # The error field; the attempt timeline further down shows the same attempt's error again.
    field = page.locator(".field-error_json")
    block = field.locator("pre.cq-traceback")
    assert block.inner_text() == trace
    assert field.locator("table.cq-error td.cq-error-message").inner_text() == "upstream <smtp> timed out"
    assert page.locator("pre.cq-traceback").count() == 2
    block.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-task-error.png"), full_page=True)
    page.close()


@pytest.mark.slow
def test_an_operator_sees_the_flow_limits_and_sets_and_clears_one(
    browser, live_server, live_store, settings
):
    from datetime import timedelta

    from cairnq_django import effective_limits, enqueue

    store = live_store
    settings.CAIRNQ = {"LIMITS": [
        {"name": "reports.generate", "concurrency": 2},
        {"key_prefix": "account:", "concurrency": 1},
        {"queue": "partner", "rate": 20, "per": timedelta(minutes=1)},
    ]}
    for _ in range(5):
        enqueue("reports.generate", {})
    for key in ("account:7", "account:7", "account:9"):
        enqueue("accounts.sync", {}, queue="accounts", concurrency_key=key)
    for _ in range(3):
        enqueue("partner.call", {}, queue="partner")
    for queue in ("default", "accounts", "partner"):
        store.claim_limited(limits=effective_limits(), queues=[queue], worker_id="w1", limit=8)
    _user("operator", "view_task", "change_limits")
    page = _login(browser, live_server, "operator")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/cairnq_django/task/dashboard/")
    page.wait_for_selector("#cq-limits")

    name_row = page.locator('#cq-limits tr[data-scope="name"][data-value="reports.generate"]')
    assert name_row.get_attribute("class") == "cq-limit-full"
    assert name_row.locator(".cq-limit-running").inner_text() == "2/2"
    assert "cq-limit-at" in name_row.locator(".cq-limit-running").get_attribute("class")
    assert name_row.locator(".cq-limit-held").inner_text() == "3"
    key_row = page.locator('#cq-limits tr[data-scope="key_prefix"]')
    assert "2 keys at the limit" in key_row.inner_text()
    assert page.locator('#cq-limits tr[data-scope="queue"] .cq-limit-starts').inner_text() == (
        "3/20 per 1m"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#cq-limits").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "admin-dashboard-limits.png"), full_page=True)

    # Raise the name's limit from the form: the panel shows the runtime limit, a Clear button.
    page.select_option("#cq-limit-form select[name=scope]", "name")
    page.fill("#cq-limit-form input[name=value]", "reports.generate")
    page.fill("#cq-limit-form input[name=concurrency]", "4")
    with page.expect_navigation():
        page.click("#cq-limit-form button[type=submit]")
    assert _messages(page) == ["Limited task name “reports.generate” to 4 running."]
    name_row = page.locator('#cq-limits tr[data-scope="name"][data-value="reports.generate"]')
    assert name_row.locator(".cq-limit-source").inner_text() == "runtime"
    assert name_row.locator(".cq-limit-running").inner_text() == "2/4"
    page.screenshot(path=str(ARTIFACTS / "admin-dashboard-limits-set.png"), full_page=True)
    with page.expect_navigation():
        name_row.locator("form.cq-limit-clear button").click()
    assert _messages(page) == ["Cleared the runtime limit on task name “reports.generate”."]
    name_row = page.locator('#cq-limits tr[data-scope="name"][data-value="reports.generate"]')
    assert name_row.locator(".cq-limit-source").inner_text() == "settings"
    assert page.locator("form.cq-limit-clear").count() == 0
    page.close()
