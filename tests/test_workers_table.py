"""The workers table, kept by real worker processes."""

from __future__ import annotations

import io
import signal
import socket

from django.core.management import call_command

from cairnq_django import cancel, enqueue, get
from cairnq_django.models import WorkerRecord
from cairnq_django.observability.overview import overview
from tests.workerutil import WorkerProcess, wait_for

FAST = {"WORKER_REPORT_INTERVAL": 200}


def rows():
    return list(WorkerRecord.objects.all())


def test_a_worker_records_itself_and_leaves_on_a_clean_stop(live_store, child_env):
    worker = WorkerProcess(child_env, "--queue", "default", "--queue", "mail", "-c", "3",
                           settings=FAST)
    try:
        task = enqueue("tests.wait_cancel", {"timeout": 60})
        # Running, and past the handler's first progress report.
        wait_for(lambda: get(task.id).progress == 0.1, timeout=60)
        # The row that counts the running task is at most one interval away.
        wait_for(lambda: [r for r in rows() if r.tasks_running == 1], timeout=60)
        [row] = rows()
        assert row.id == get(task.id).worker_id
        assert (row.host, row.pid) == (socket.gethostname(), worker.pid)
        assert row.queues == ["default", "mail"] and row.concurrency == 3
        assert "tests.wait_cancel" in row.names and row.interval_ms == 200
        assert row.version and row.started_at_ms <= row.last_seen_ms
        [view] = overview("default").workers
        assert view.live and [t.id for t in view.running] == [task.id]

        out = io.StringIO()
        call_command("cairnq_status", stdout=out)
        assert out.getvalue().startswith("Workers: 1 live, 0 gone\n")
        assert f"  {row.id} runs tests.wait_cancel {task.id} 10%" in out.getvalue()

        cancel(task.id)
        wait_for(lambda: get(task.id).status == "canceled", timeout=60)
        wait_for(lambda: [r for r in rows() if r.tasks_done == 1], timeout=60)
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert rows() == []
    finally:
        worker.stop()


def test_a_killed_worker_shows_as_gone_and_stops_serving(live_store, child_env):
    worker = WorkerProcess(child_env, settings=FAST)
    try:
        wait_for(rows, timeout=60)
        worker.signal(signal.SIGKILL)
        worker.wait()
        # Nothing removes the row; after three intervals without a report it is gone.
        wait_for(lambda: not overview("default").workers[0].live, timeout=60)
        [row] = rows()
        assert row.pid == worker.pid
        enqueue("tests.echo", {})
        out, err = io.StringIO(), io.StringIO()
        try:
            call_command("cairnq_health", stdout=out, stderr=err)
            code = 0
        except SystemExit as exc:
            code = exc.code
        assert code == 1 and "no live worker serves it" in err.getvalue()
    finally:
        worker.stop()


def test_a_live_worker_forgets_long_gone_ones(live_store, child_env):
    WorkerRecord.objects.create(
        id="worker_ANCIENT", host="elsewhere", pid=1, queues=["default"], concurrency=1,
        version="0", started_at_ms=0, last_seen_ms=0, interval_ms=1000,
    )
    worker = WorkerProcess(child_env, settings=FAST)
    try:
        wait_for(lambda: [r.id for r in rows()] and "worker_ANCIENT" not in
                 [r.id for r in rows()], timeout=60)
        assert len(rows()) == 1 and rows()[0].pid == worker.pid
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait()
        worker.stop()
