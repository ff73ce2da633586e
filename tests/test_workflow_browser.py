"""The workflow page in a real browser (see test_admin_browser.py for what it needs): the graph
drawn, a step's box leading to its task, cancel from the page; a screenshot kept in artifacts/."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote

from cairnq_django import Workflow, get_workflow
from cairnq_django.workflows.settling import StepSettling

from .test_admin_browser import ARTIFACTS, PASSWORD, _user, browser  # noqa: F401 - the fixture


def _settle_first(store, status: str) -> None:
    """Claim one task and settle it through the worker's step settle, as a Django worker would."""
    [task] = store.claim(queues=["default"], worker_id="w1", limit=1)
    settling = StepSettling(store)
    if status == "succeeded":
        settling.complete(task.id, "w1", {"pages": 3})
    else:
        settling.fail(task.id, "w1", "upstream said 503", retryable=False)


@pytest.mark.slow
def test_the_graph_page_draws_steps_by_state_and_cancels(browser, live_server, live_store):  # noqa: F811
    wf = Workflow("crawl example.org")
    crawl = wf.add("crawl", "site.crawl", {"site": 1})
    fetched = wf.map("fetch", "site.fetch", [{"url": f"/p{i}"} for i in range(6)], after=crawl)
    index = wf.add("index", "site.index", after=fetched)
    wf.add("notify", "site.notify", after=index, when="finished")
    run = wf.enqueue()
    _settle_first(live_store, "succeeded")  # crawl: releases the six fetches
    _settle_first(live_store, "succeeded")
    _settle_first(live_store, "failed")
    _user("root", superuser=True)

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(30_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/cairnq_django/workflow/{quote(run.id)}/change/")
    page.fill("#id_username", "root")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("svg.cq-wf-graph")
    assert page.locator(".cq-wf-step").count() == 9
    assert page.locator("a.cq-wf-succeeded").count() == 2
    assert page.locator("a.cq-wf-failed").count() == 1
    # index (when="succeeded") was canceled by the failed fetch; notify (when="finished") released.
    assert page.locator("a.cq-wf-queued").count() == 5
    assert page.locator("g.cq-wf-canceled").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-workflow-graph.png"), full_page=True)

    with page.expect_navigation():
        page.click("a.cq-wf-failed")
    assert "upstream said 503" in page.content()

    page.go_back()
    with page.expect_navigation():
        page.click('#cq-wf-actions button[value="cancel"]')
    assert "Canceled workflow" in page.inner_text("ul.messagelist")
    run = get_workflow(run.id)
    assert run.state == "canceled"  # every queued step ended at once
    assert [s.state for s in run.steps].count("canceled") == 6
