"""cairnq_worker and the reference peer's worker run each other's tasks.

Tasks submitted by the `cairnq` 0.15.1 SDK are run by `manage.py cairnq_worker`;
tasks enqueued by cairnq_django are run by an SDK worker in its own process.
Results and error envelopes read the same from both sides.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from cairnq_django import enqueue, get
from tests.peer import sdk_target, with_sdk
from tests.workerutil import ROOT, run_burst

pytestmark = pytest.mark.slow

VENDOR = connection.vendor


_SDK_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from cairnq import Worker, TaskError

    vendor, target, *ids = sys.argv[1:]
    make = Worker.sqlite if vendor == "sqlite" else Worker.postgres
    worker = make(target, queues=["default"], concurrency=2, lease_ms=5000,
                  poll_interval_ms=50, retry_backoff_ms=0)

    @worker.task("peer.double")
    async def double(ctx, payload):
        await ctx.progress(0.5, "halfway")
        return {"doubled": payload["n"] * 2, "by": "sdk"}

    @worker.task("peer.refuse")
    async def refuse(ctx, payload):
        raise TaskError("not today", code="refused", details={"n": payload["n"]})

    async def main():
        async with worker.background():
            for _ in range(600):
                tasks = [await worker._store.get(task_id) for task_id in ids]
                if all(t.status in ("succeeded", "failed", "canceled") for t in tasks):
                    return
                await asyncio.sleep(0.1)
            sys.exit("The SDK worker did not finish the tasks in time.")

    asyncio.run(main())
    """
)


def test_tasks_from_the_sdk_run_on_cairnq_worker(live_store, child_env):
    async def submit(client):
        ok = await client.submit("tests.echo", {"from": "sdk"})
        bad = await client.submit("tests.permanent", {})
        return ok.id, bad.id

    ok_id, bad_id = with_sdk(submit)
    run_burst(child_env)

    async def read(client):
        return await client.get(ok_id), await client.get(bad_id)

    ok, bad = with_sdk(read)
    assert ok.status == "succeeded"
    assert ok.result == {"echo": {"from": "sdk"}, "attempt": 1}
    assert bad.status == "failed"
    assert bad.error["code"] == "bad_input" and bad.error["retryable"] is False
    assert bad.error["details"] == {"field": "x"}


def test_tasks_from_django_run_on_the_sdk_worker(live_store):
    ok = enqueue("peer.double", {"n": 21})
    bad = enqueue("peer.refuse", {"n": 1})
    proc = subprocess.run(
        [sys.executable, "-c", _SDK_WORKER, VENDOR, sdk_target(), ok.id, bad.id],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = get(ok.id)
    assert done.status == "succeeded"
    assert done.result == {"doubled": 42, "by": "sdk"}
    assert done.message == "halfway" and done.progress == 1.0
    failed = get(bad.id)
    assert failed.status == "failed"
    assert failed.error["code"] == "refused"
    assert failed.error["message"] == "not today"
    assert failed.error["details"] == {"n": 1}
