"""The dashboard and the task page in headless Chromium, with a real worker running.

Saves artifacts/admin-dashboard.png and artifacts/admin-task-page.png.
"""

from __future__ import annotations

import signal

import pytest

from cairnq_django import enqueue, get
from cairnq_django.admin.views.dashboard import MINUTE_MS
from cairnq_django.models import Task, WorkerRecord
from cairnq_django.observability.overview import database_now_ms
from cairnq_django.store.leases import get_leases
from tests.workerutil import WorkerProcess, wait_for

from .test_admin_browser import ARTIFACTS, _login, _make, _messages, _user, browser  # noqa: F401


@pytest.fixture
def worker(live_store, child_env):
    process = WorkerProcess(child_env, "--lease", "3000", settings={"WORKER_REPORT_INTERVAL": 200})
    yield process
    process.signal(signal.SIGTERM)
    process.wait()
    process.stop()


def _history(store) -> None:
    """Finished tasks spread over the last hour, so the chart has a shape."""
    now = database_now_ms("default")
    for minutes_ago, status in [(50, "succeeded"), (40, "failed"), (30, "succeeded"),
                                (30, "succeeded"), (10, "succeeded"), (2, "failed")]:
        task = _make(store, status, "reports.build", queue="reports")
        Task.objects.filter(pk=task.id).update(completed_at_ms=now - minutes_ago * MINUTE_MS)


@pytest.mark.slow
def test_dashboard_and_task_page_follow_a_running_task(browser, live_server, worker):  # noqa: F811
    store = get_leases("default")
    _history(store)
    failed = _make(store, "failed", "reports.build", queue="reports")
    task = enqueue("tests.wait_cancel", {"timeout": 120})
    # Running, and past the handler's first progress report ("started").
    wait_for(lambda: get(task.id).message == "started", timeout=60)
    worker_id = get(task.id).worker_id
    wait_for(lambda: WorkerRecord.objects.filter(pk=worker_id, tasks_running=1).exists(),
             timeout=60)
    _user("root", superuser=True)
    page = _login(browser, live_server, "root")
    page.set_viewport_size({"width": 1400, "height": 900})

    page.click("a.cq-dashboard-link")
    page.wait_for_selector("#cq-throughput")
    assert page.locator("#cq-throughput polyline").count() == 3
    row = page.locator(f'#cq-workers tr[data-worker="{worker_id}"]')
    assert row.get_attribute("class") == "cq-live"
    assert "tests.wait_cancel" in row.inner_text()
    assert page.locator('#cq-queues tr[data-queue="default"] td').nth(1).inner_text() == "1"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-dashboard.png"), full_page=True)

    # The task page: the live panel follows the progress the handler reports.
    row.locator("a", has_text="tests.wait_cancel").click()
    page.wait_for_selector("#cq-live")
    assert page.inner_text("#cq-live .cq-live-message") == "started"
    store.progress(task.id, worker_id, 0.5, "halfway there")
    page.wait_for_function(
        "() => document.querySelector('#cq-live .cq-live-message').textContent"
        " === 'halfway there'"
    )
    assert page.inner_text("#cq-live .cq-live-percent") == "50%"
    assert page.locator("#cq-live progress").get_attribute("value") == "50"
    assert page.inner_text(".field-message_text .readonly") == "halfway there"
    assert page.eval_on_selector(".field-progress_bar progress", "bar => bar.value") == 50
    page.screenshot(path=str(ARTIFACTS / "admin-task-page.png"), full_page=True)

    # A progress no percent can show (another SDK's Infinity): the panel says so.
    Task.objects.filter(pk=task.id).update(progress=float("inf"), message="odd progress")
    page.wait_for_function(
        "() => document.querySelector('#cq-live .cq-live-message').textContent"
        " === 'odd progress'"
    )
    assert page.inner_text("#cq-live .cq-live-percent") == "invalid"
    assert page.inner_text(".field-progress_bar .readonly").strip() == "invalid"

    # Cancel: the worker notices at its next heartbeat, and the page reloads.
    with page.expect_navigation():
        page.click("button.cq-cancel")
    assert _messages(page) == [
        "Asked the running task to stop; it ends canceled when its worker notices."
    ]
    page.wait_for_selector(".readonly .cq-status-canceled", timeout=60_000)
    assert page.locator("#cq-live").count() == 0
    assert get(task.id).status == "canceled"

    # Retry from a failed task's page (no worker runs its name, so it stays queued).
    page.goto(f"{live_server.url}/admin/cairnq_django/task/{failed.id}/change/")
    with page.expect_navigation():
        page.click("button.cq-retry")
    assert _messages(page) == ["Queued the task again."]
    assert get(failed.id).status == "queued"
    assert page.locator("button.cq-retry").count() == 0
    page.close()


@pytest.mark.slow
def test_the_task_list_fits_a_laptop_screen(browser, live_server, live_store):  # noqa: F811
    _make(live_store, "running", "imports.customers.csv", queue="imports",
          key="import:customers:2026-11-30")
    _make(live_store, "queued", "emails.send_welcome", queue="mail")
    _user("root", superuser=True)
    page = _login(browser, live_server, "root")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.reload()
    # The table scrolls inside its container when it is too wide: nothing may be hidden.
    overflow = page.evaluate(
        "() => { const box = document.querySelector('#changelist .results');"
        " return box.scrollWidth - box.clientWidth; }"
    )
    page.screenshot(path=str(ARTIFACTS / "admin-changelist-1400.png"), full_page=True)
    assert overflow <= 0
    assert "import:customers:2026-11-30" in page.inner_text("#result_list")
    page.close()
