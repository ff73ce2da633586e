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
    assert failed.id in page.inner_text("#result_list")
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
