"""The worker in real `manage.py cairnq_worker` processes: what lands in the rows."""

import subprocess
import sys

from cairnq_django import cancel, enqueue, get
from tests.storeutil import sql
from tests.workerutil import (
    ROOT,
    WorkerProcess,
    run_burst,
    runs,
    wait_for,
)

NO_BACKOFF = {"RETRY_BACKOFF_BASE": 0}


def test_handlers_run_and_results_land(live_store, child_env):
    sync = enqueue("tests.echo", {"n": 1})
    async_ = enqueue("tests.async_echo", {"n": 2})
    out = run_burst(child_env)
    done = get(sync.id)
    assert done.status == "succeeded"
    assert done.result == {"echo": {"n": 1}, "attempt": 1}
    assert done.progress == 1.0 and done.lease_until_ms is None
    assert done.worker_id and done.worker_id.startswith("worker_")
    done = get(async_.id)
    assert done.status == "succeeded"
    assert done.result == {"echo": {"n": 2}, "async": True}
    # One line at start and end of each task, and a startup line.
    assert "starting on database 'default'" in out
    assert "concurrency 8" in out and "queues default" in out and "tests.echo" in out
    assert f"Task tests.echo {sync.id} attempt 1/3 started." in out
    assert f"Task tests.echo {sync.id} attempt 1/3 succeeded in " in out


def test_retryable_failure_is_retried_then_succeeds(live_store, child_env):
    task = enqueue("tests.flaky", {"succeed_on": 3}, max_attempts=3)
    run_burst(child_env, settings=NO_BACKOFF)
    done = get(task.id)
    assert done.status == "succeeded"
    assert done.attempt == 3
    assert done.result == {"attempt": 3}


def test_retry_backoff_delays_the_next_attempt(live_store, child_env):
    task = enqueue("tests.flaky", {"succeed_on": 2})
    run_burst(child_env, settings={"RETRY_BACKOFF_BASE": 60_000, "RETRY_BACKOFF_CAP": 60_000})
    row = get(task.id)
    assert row.status == "queued" and row.attempt == 1
    # Equal jitter: the delay is in [window/2, window) of a 60 s window.
    delay = row.run_at_ms - row.updated_at_ms
    assert 30_000 <= delay < 60_000
    assert row.error["type"] == "RuntimeError"
    assert row.error["code"] == "handler_error"
    assert row.error["retryable"] is True
    assert row.error["message"] == "flaky failure on attempt 1"
    assert "Traceback" in row.error["details"]["traceback"]


def test_exhausted_attempts_fail(live_store, child_env):
    task = enqueue("tests.flaky", {"succeed_on": 9}, max_attempts=2)
    run_burst(child_env, settings=NO_BACKOFF)
    row = get(task.id)
    assert row.status == "failed" and row.attempt == 2
    assert row.error["code"] == "handler_error"


def test_task_error_fails_permanently_with_its_envelope(live_store, child_env):
    task = enqueue("tests.permanent", {})
    run_burst(child_env, settings=NO_BACKOFF)
    row = get(task.id)
    assert row.status == "failed" and row.attempt == 1
    assert row.error == {
        "type": "TaskError",
        "code": "bad_input",
        "message": "The input is not acceptable.",
        "retryable": False,
        "details": {"field": "x"},
    }


def test_unserializable_result_fails_permanently(live_store, child_env):
    task = enqueue("tests.unserializable", {})
    run_burst(child_env, settings=NO_BACKOFF)
    row = get(task.id)
    assert row.status == "failed" and row.attempt == 1
    assert row.error["code"] == "unserializable_result"
    assert row.error["retryable"] is False


def test_only_registered_names_are_claimed(live_store, child_env):
    unknown = enqueue("tests.nobody_handles_this", {})
    known = enqueue("tests.echo", {})
    run_burst(child_env)
    assert get(unknown.id).status == "queued"
    assert get(unknown.id).attempt == 0
    assert get(known.id).status == "succeeded"


def test_names_option_restricts_the_claim(live_store, child_env):
    echo = enqueue("tests.echo", {})
    other = enqueue("tests.async_echo", {})
    run_burst(child_env, "--names", "tests.echo")
    assert get(echo.id).status == "succeeded"
    assert get(other.id).status == "queued"


def test_queue_option_selects_queues(live_store, child_env):
    mail = enqueue("tests.echo", {}, queue="mail")
    default = enqueue("tests.echo", {})
    out = run_burst(child_env, "--queue", "mail", "--queue", "other")
    assert "queues mail, other" in out
    assert get(mail.id).status == "succeeded"
    assert get(default.id).status == "queued"


def test_unknown_name_is_a_command_error(live_store, child_env):
    proc = subprocess.run(
        [sys.executable, "-m", "django", "cairnq_worker", "--burst", "--names", "nope"],
        env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "No handler is registered for 'nope'" in proc.stderr


def test_help_explains_every_option(child_env):
    proc = subprocess.run(
        [sys.executable, "-m", "django", "cairnq_worker", "--help"],
        env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0
    for option in (
        "--queue", "--names", "--concurrency", "--lease", "--poll", "--max-run",
        "--shutdown-timeout", "--burst", "--database", "--sweep",
    ):
        assert option in proc.stdout
    assert "SIGTERM" in proc.stdout


def test_children_get_parent_and_root(live_store, child_env):
    parent = enqueue("tests.spawn", {"children": 2}, correlation_id="order-7")
    run_burst(child_env)
    row = get(parent.id)
    assert row.status == "succeeded"
    children = [get(child_id) for child_id in row.result["children"]]
    assert len(children) == 2
    for child in children:
        assert child.parent_id == parent.id
        assert child.root_id == parent.id
        assert child.correlation_id == "order-7"
        assert child.status == "succeeded"  # the same burst ran them


def test_batch_delivery_settles_each_task(live_store, child_env):
    tasks = [enqueue("tests.batch", {"value": i, "fail": i == 2}) for i in range(6)]
    run_burst(child_env, "--concurrency", "1")
    rows = [get(t.id) for t in tasks]
    sizes = sorted(r.result["batch_size"] for r in rows if r.status == "succeeded")
    # Up to 4 per call: one call of 4, one of 2. Tasks enqueued in the same
    # millisecond are claimed in id order, whose random half decides which call
    # the rejected task lands in.
    assert sizes in ([2, 2, 4, 4, 4], [2, 4, 4, 4, 4])
    assert rows[2].status == "failed"
    assert rows[2].error["code"] == "rejected"
    assert all(r.attempt == 1 for r in rows)


def test_per_name_concurrency_runs_one_call_at_a_time(live_store, child_env, runs_table):
    for _ in range(3):
        enqueue("tests.limited", {"seconds": 0.2})
    enqueue("tests.echo", {})
    run_burst(child_env, "--concurrency", "4")
    notes = [note for _, _, _, note in runs()]
    # concurrency=1: every start is followed by its own end before the next start.
    assert notes == ["limited-start", "limited-end"] * 3


def test_cancel_of_running_task_ends_canceled(live_store, child_env):
    task = enqueue("tests.wait_cancel", {"timeout": 60})
    worker = WorkerProcess(child_env, "--burst", "--lease", "900")
    try:
        wait_for(lambda: get(task.id).status == "running", timeout=60)
        wait_for(lambda: get(task.id).message == "started", timeout=30)
        cancel(task.id)
        assert worker.wait(60) == 0
    finally:
        worker.stop()
    row = get(task.id)
    assert row.status == "canceled"
    assert row.lease_until_ms is None and row.completed_at_ms is not None


def test_atomic_rolls_back_handler_writes_when_the_lease_is_gone(
    live_store, child_env, runs_table
):
    task = enqueue("tests.atomic_write", {"wait_for_steal": True, "marker": "stolen"})
    # A long lease: the heartbeat does not notice the theft before the commit tries.
    worker = WorkerProcess(child_env, "--burst", "--lease", "60000")
    try:
        wait_for(lambda: get(task.id).status == "running", timeout=60)
        # Another worker takes the task over (as lease recovery + a new claim would).
        sql(
            live_store.using,
            "UPDATE cairnq_tasks SET worker_id = 'worker_thief' WHERE id = %s",
            [task.id],
        )
        assert worker.wait(60) == 0
        out = worker.output()
    finally:
        worker.stop()
    assert runs() == []  # the handler's insert rolled back with the completion
    row = get(task.id)
    assert row.status == "running" and row.worker_id == "worker_thief"
    assert "lost its lease" in out


def test_atomic_commits_handler_writes_with_the_completion(live_store, child_env, runs_table):
    task = enqueue("tests.atomic_write", {"marker": "kept"})
    run_burst(child_env)
    row = get(task.id)
    assert row.status == "succeeded" and row.result == {"marker": "kept"}
    assert [(r[0], r[3]) for r in runs()] == [(task.id, "kept")]


def test_max_run_abandons_a_hung_handler(live_store, child_env):
    task = enqueue("tests.sleep", {"seconds": 30}, max_attempts=1)
    out = run_burst(child_env, "--max-run", "500", "--shutdown-timeout", "0")
    row = get(task.id)
    assert row.status == "failed"
    assert row.error["code"] == "handler_timeout"
    assert row.error["retryable"] is True
    assert "ran longer than max-run" in out
