"""cairnq_health and cairnq_status against rows the tests write themselves."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cairnq_django import enqueue
from cairnq_django.models import Task, WorkerRecord
from cairnq_django.observability.overview import database_now_ms
from tests.workerutil import ROOT

HOUR_MS = 3_600_000


def health(*args):
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("cairnq_health", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), err.getvalue()


def status(*args):
    out = io.StringIO()
    call_command("cairnq_status", *args, stdout=out)
    return out.getvalue()


def add_worker(worker_id="worker_T1", *, queues=("default",), seen_ago_ms=0, interval_ms=10_000):
    now = database_now_ms("default")
    return WorkerRecord.objects.create(
        id=worker_id, host="testhost", pid=4242, queues=list(queues), names=["tests.echo"],
        concurrency=4, version="0.1.0", started_at_ms=now - HOUR_MS,
        last_seen_ms=now - seen_ago_ms, interval_ms=interval_ms, tasks_done=7,
    )


def age(task, ms):
    Task.objects.filter(pk=task.id).update(run_at_ms=database_now_ms("default") - ms)


def test_an_empty_queue_is_healthy(store):
    assert health() == (0, "OK\n", "")


def test_due_tasks_without_a_live_worker_are_unhealthy(store):
    enqueue("tests.echo", {}, queue="mail")
    add_worker(queues=["default"])  # serves another queue
    code, out, err = health()
    assert code == 1 and out == ""
    assert err.startswith("Queue 'mail' has 1 queued task(s), the oldest due ")
    assert err.endswith(" ago, and no live worker serves it.\n")


def test_a_gone_worker_does_not_serve_its_queue(store):
    enqueue("tests.echo", {})
    add_worker(seen_ago_ms=31_000, interval_ms=10_000)  # three intervals and more
    code, _, err = health()
    assert code == 1 and "no live worker serves it" in err


def test_a_delayed_task_is_not_due(store):
    enqueue("tests.echo", {}, delay=HOUR_MS)
    assert health()[0] == 0


def test_the_oldest_due_task_waiting_too_long_is_unhealthy(store):
    add_worker()
    task = enqueue("tests.echo", {})
    assert health("--max-age", "5m")[0] == 0
    age(task, 10 * 60_000)
    code, _, err = health("--max-age", "5m")
    assert code == 1
    # The seconds are those that passed since age() set the clock back.
    assert re.fullmatch(
        r"Queue 'default': the oldest due task has waited 10 min \d+ s, longer than "
        r"5 min 0 s\.\n", err,
    ), err


def test_only_the_named_queues_are_checked(store):
    add_worker()
    enqueue("tests.echo", {}, queue="mail")
    assert health("--queue", "default")[0] == 0
    assert health("--queue", "mail")[0] == 1


def test_max_age_must_be_a_duration(store):
    with pytest.raises(CommandError) as raised:
        health("--max-age", "soon")
    assert str(raised.value).startswith("Error: argument --max-age: 'soon' is not a duration;")


def test_status_prints_workers_and_queues(store):
    add_worker("worker_LIVE")
    add_worker("worker_GONE", seen_ago_ms=HOUR_MS)
    running = enqueue("tests.echo", {})
    Task.objects.filter(pk=running.id).update(
        status="running", worker_id="worker_LIVE", progress=0.25,
        lease_until_ms=database_now_ms("default") + 60_000,
    )
    enqueue("tests.echo", {}, queue="mail")
    out = status()
    assert out.startswith("Workers: 1 live, 1 gone\n")
    lines = out.splitlines()
    live = next(line for line in lines if line.startswith("worker_LIVE"))
    assert live.split()[:7] == ["worker_LIVE", "testhost", "4242", "default", "4", "1", "7"]
    assert live.endswith("live")
    assert next(line for line in lines if line.startswith("worker_GONE")).endswith("gone")
    assert f"  worker_LIVE runs tests.echo {running.id} 25%" in lines
    queues = lines[lines.index("Queues: 2") + 1 :]
    assert queues[0].split() == [
        "QUEUE", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELED", "OLDEST", "DUE", "STATE",
    ]
    assert queues[1].split()[:6] == ["default", "0", "1", "0", "0", "0"]
    assert queues[2].split()[:6] == ["mail", "1", "0", "0", "0", "0"]


def test_status_as_json(store):
    add_worker()
    enqueue("tests.echo", {})
    data = json.loads(status("--json"))
    assert [w["id"] for w in data["workers"]] == ["worker_T1"]
    assert data["workers"][0]["live"] is True
    assert data["queues"]["default"]["queued"] == 1
    assert data["queues"]["default"]["oldest_due_age_ms"] >= 0


def test_an_unreachable_database_exits_2(child_env):
    env = dict(child_env)
    if os.environ.get("CAIRNQ_TEST_DATABASE") == "postgres":
        env["PGPORT"] = "1"  # nothing listens there
    else:
        env["CAIRNQ_CHILD_DB_NAME"] = "/nonexistent/dir/queue.sqlite3"
    proc = subprocess.run(
        [sys.executable, "-m", "django", "cairnq_health"], env=env, cwd=ROOT,
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("The queue's database is unreachable: ")


def test_cairnq_status_version_prints_the_package_version(capsys):
    from importlib import metadata

    from django.core.management import ManagementUtility

    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", "cairnq_status", "--version"]).execute()
    assert exited.value.code == 0
    version = metadata.version("cairnq-django")
    assert capsys.readouterr().out.strip() == f"cairnq-django {version}"
