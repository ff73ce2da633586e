"""Interoperability with the reference peer, process to process.

The `cairnq` 0.15.1 SDK runs in its own Python processes (tests/interop_sdk.py,
no Django there) next to our `cairnq_worker` command and this test process, all
on the committed test database. Results and error envelopes are read back
through both implementations and must agree.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from cairnq_django import TaskFailed, client

from . import catalog
from .workerutil import WorkerProcess, run_burst

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SDK_SCRIPT = str(ROOT / "tests" / "interop_sdk.py")


def sdk_target() -> str:
    """Where the SDK connects: the test DB file, or a DSN for the test database."""
    name = str(connection.settings_dict["NAME"])
    return name if connection.vendor == "sqlite" else catalog.pg_dsn(name)


def sdk_command(action: str, args: dict) -> list[str]:
    return [sys.executable, SDK_SCRIPT, action, sdk_target(), json.dumps(args)]


def sdk(action: str, args: dict, timeout: float = 120) -> dict:
    """Run one SDK action in a child process and return its JSON answer."""
    done = subprocess.run(
        sdk_command(action, args), cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"The SDK process failed:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def our_view(task_id: str) -> dict:
    """The task as cairnq_django reads it, in the SDK script's shape."""
    task = client.get(task_id)
    return {
        "name": task.name,
        "status": task.status,
        "result": task.result,
        "error": task.error,
        "attempt": task.attempt,
        "worker_id": task.worker_id,
        "progress": task.progress,
        "message": task.message,
    }


def test_tasks_submitted_by_the_sdk_run_on_cairnq_worker(live_store, child_env):
    ids = sdk(
        "submit",
        {
            "tasks": [
                {"name": "tests.echo", "payload": {"n": 1, "s": "é"}, "queue": "interop"},
                {"name": "tests.permanent", "payload": {}, "queue": "interop"},
                {"name": "tests.async_echo", "payload": {"n": 3}, "queue": "interop"},
            ]
        },
    )["ids"]
    assert [our_view(i)["status"] for i in ids] == ["queued"] * 3

    run_burst(child_env, "--queue", "interop")

    echo, permanent, async_echo = (our_view(i) for i in ids)
    assert echo["status"] == "succeeded"
    assert echo["result"] == {"echo": {"n": 1, "s": "é"}, "attempt": 1}
    assert async_echo["status"] == "succeeded"
    assert async_echo["result"] == {"echo": {"n": 3}, "async": True}
    assert permanent["status"] == "failed"
    assert permanent["error"]["code"] == "bad_input"
    assert permanent["error"]["message"] == "The input is not acceptable."
    assert permanent["error"]["retryable"] is False
    assert permanent["error"]["details"] == {"field": "x"}
    # The SDK reads exactly what we read.
    theirs = sdk("read", {"ids": ids})["tasks"]
    assert theirs == {i: our_view(i) for i in ids}
    assert client.wait(ids[0], timeout=5).result == echo["result"]


def test_tasks_enqueued_by_django_run_on_the_sdk_worker(live_store):
    add = client.enqueue("interop.add", {"a": 2, "b": 3}, queue="interop-sdk")
    boom = client.enqueue("interop.boom", {"why": "bad luck"}, queue="interop-sdk", max_attempts=1)
    reject = client.enqueue("interop.reject", {"k": 1}, queue="interop-sdk")
    ids = [add.id, boom.id, reject.id]

    worker = subprocess.Popen(
        sdk_command("work", {"ids": ids, "queues": ["interop-sdk"], "timeout": 90}),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Waits across implementations: our wait() sees the SDK worker's settles.
        assert client.wait(add.id, timeout=120).result == {"sum": 5, "by": "sdk"}
        with pytest.raises(TaskFailed) as failed:
            client.wait(boom.id, timeout=120)
        out, err = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, f"The SDK worker failed:\n{err}"
    seen_by_sdk = json.loads(out.strip().splitlines()[-1])["tasks"]

    assert failed.value.code == "handler_error"
    ours = {i: our_view(i) for i in ids}
    assert ours == seen_by_sdk
    assert ours[add.id]["status"] == "succeeded" and ours[add.id]["progress"] == 1.0
    assert ours[boom.id]["status"] == "failed" and ours[boom.id]["attempt"] == 1
    assert ours[boom.id]["error"] == {
        "type": "ValueError",
        "code": "handler_error",
        "message": "boom: bad luck",
        "retryable": True,
        "details": {},
    }
    assert ours[reject.id]["status"] == "failed" and ours[reject.id]["attempt"] == 1
    assert ours[reject.id]["error"] == {
        "type": "TaskError",
        "code": "sdk_rejected",
        "message": "The SDK handler rejects this input.",
        "retryable": False,
        "details": {"input": {"k": 1}},
    }
    # And a fresh SDK process reads the same rows again.
    assert sdk("read", {"ids": ids})["tasks"] == ours


def test_a_running_cairnq_worker_picks_up_sdk_submissions(live_store, child_env):
    worker = WorkerProcess(child_env, "--queue", "interop-live", "--concurrency", "2")
    try:
        ids = sdk(
            "submit",
            {
                "tasks": [
                    {"name": "tests.echo", "payload": {"i": i}, "queue": "interop-live"}
                    for i in range(3)
                ]
            },
        )["ids"]
        results = [client.wait(i, timeout=120).result for i in ids]
        assert results == [{"echo": {"i": i}, "attempt": 1} for i in range(3)]
        theirs = sdk("read", {"ids": ids})["tasks"]
        assert {i: t["status"] for i, t in theirs.items()} == dict.fromkeys(ids, "succeeded")
        assert [theirs[i]["result"] for i in ids] == results
        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
    finally:
        worker.stop()


def test_sdk_and_cairnq_worker_share_one_queue(live_store, child_env):
    # Names partition the work: each side claims only the names it handles.
    ours_id = client.enqueue("tests.echo", {"side": "django"}, queue="shared").id
    theirs_id = client.enqueue("interop.add", {"a": 1, "b": 1}, queue="shared").id
    run_burst(child_env, "--queue", "shared", "--names", "tests.echo")
    assert client.get(ours_id).status == "succeeded"
    assert client.get(theirs_id).status == "queued"
    state = sdk("work", {"ids": [theirs_id], "queues": ["shared"], "timeout": 90})["tasks"]
    assert state[theirs_id]["status"] == "succeeded"
    assert client.get(theirs_id).result == {"sum": 2, "by": "sdk"}
    assert client.get(ours_id).worker_id != client.get(theirs_id).worker_id
