"""TaskContext's async twins, each run by a real worker and by cairnq_django.testing.

A worker runs an async handler on its event-loop thread and the twins' database
work on its database threads, against committed rows; the testing runner runs
it inside the test's transaction, so the twins must use the test's connection.
"""

import asyncio

import pytest

from cairnq_django import cancel, enqueue, get
from cairnq_django.models import TaskFlow
from cairnq_django.testing import run_tasks
from cairnq_django.worker import Registry, Worker


def _by_worker(reg):
    Worker(registry=reg, burst=True, concurrency=1, retry_backoff_base_ms=0, scheduler=False).run()


def _by_testing(reg):
    with run_tasks(registry=reg, retries=True) as runner:
        runner.drain()


# Each test runs every due task of its registry twice over: by an in-process
# worker (burst mode, real commits), and by the testing runner inside the
# test's transaction.
@pytest.fixture(
    params=[
        pytest.param(_by_worker, id="worker", marks=pytest.mark.django_db(transaction=True)),
        pytest.param(_by_testing, id="testing", marks=pytest.mark.django_db),
    ]
)
def run(request):
    return request.param


def test_aprogress_aheartbeat_and_run_db(run):
    reg = Registry()
    seen = {}

    async def handler(ctx, payload):
        reported = await ctx.aprogress(0.5, "half way")
        renewed = await ctx.aheartbeat()
        row = await ctx.run_db(lambda: get(ctx.task_id))
        seen.update(reported=reported, renewed=renewed, row=row)
        return "done"

    reg.register("ac.report", handler)
    task = enqueue("ac.report", {})
    run(reg)

    assert seen["reported"].progress == 0.5 and seen["reported"].message == "half way"
    assert seen["renewed"].lease_until_ms >= seen["reported"].lease_until_ms
    # run_db read the row as the handler's own writes left it.
    assert (seen["row"].status, seen["row"].progress, seen["row"].message) == (
        "running", 0.5, "half way",
    )
    done = get(task.id)
    assert done.status == "succeeded" and done.result == "done"


def test_asucceed_settles_once(run):
    reg = Registry()
    again = []

    async def handler(ctx, payload):
        row = await ctx.asucceed({"early": True})
        assert row.status == "succeeded"
        again.append(await ctx.asucceed("twice"))
        return "ignored: already settled"

    reg.register("ac.succeed", handler)
    task = enqueue("ac.succeed", {})
    run(reg)

    assert again == [None]
    done = get(task.id)
    assert done.status == "succeeded" and done.result == {"early": True}


def test_afail_fails_for_good_or_retries(run):
    reg = Registry()
    attempts = []

    async def final(ctx, payload):
        await ctx.afail("Refused.", retryable=False)

    async def flaky(ctx, payload):
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            row = await ctx.afail(ValueError("first try"))
            assert row.status == "queued"
            return None
        return "second try"

    reg.register("ac.final", final)
    reg.register("ac.flaky", flaky)
    refused = enqueue("ac.final", {}, max_attempts=3)
    retried = enqueue("ac.flaky", {}, max_attempts=2)
    run(reg)

    row = get(refused.id)
    assert row.status == "failed" and row.attempt == 1
    assert row.error["message"] == "Refused." and row.error["retryable"] is False
    assert attempts == [1, 2]
    row = get(retried.id)
    assert row.status == "succeeded" and row.result == "second try"


def test_acanceled_sees_a_cancel_requested_while_running(run):
    reg = Registry()
    seen = []

    async def handler(ctx, payload):
        before = await ctx.acanceled()
        await ctx.run_db(lambda: cancel(ctx.task_id))
        await asyncio.sleep(0.25)  # canceled() trusts its last read for 0.2 s
        seen.append((before, await ctx.acanceled()))
        return "stopped early"

    reg.register("ac.cancel", handler)
    task = enqueue("ac.cancel", {})
    run(reg)

    assert seen == [(False, True)]
    assert get(task.id).status == "canceled"


def test_asnooze_requeues_without_failing(run):
    reg = Registry()

    async def handler(ctx, payload):
        row = await ctx.asnooze(60)
        assert row.status == "queued"
        return "not yet"

    reg.register("ac.snooze", handler)
    task = enqueue("ac.snooze", {}, max_attempts=1)
    run(reg)

    row = get(task.id)
    assert row.status == "queued" and row.error is None and row.result is None
    assert TaskFlow.objects.get(task_id=task.id).snoozes == 1


def test_asubmit_enqueues_a_child_of_the_task(run):
    reg = Registry()
    children = []

    async def parent(ctx, payload):
        child = await ctx.asubmit("ac.child", {"n": 1})
        children.append(child)
        return child.id

    async def child(ctx, payload):
        return payload["n"] + 1

    reg.register("ac.parent", parent)
    reg.register("ac.child", child)
    task = enqueue("ac.parent", {}, correlation_id="order-7")
    run(reg)

    [submitted] = children
    assert get(task.id).result == submitted.id
    row = get(submitted.id)
    assert (row.parent_id, row.root_id, row.correlation_id) == (task.id, task.id, "order-7")
    assert row.status == "succeeded" and row.result == 2
