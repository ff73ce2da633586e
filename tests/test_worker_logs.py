"""What a real worker process logs when attempts fail (lines an operator can act on),
and how an attempt past max_attempts is shown there and in the admin."""

from cairnq_django import enqueue, get, retry
from tests.storeutil import make
from tests.workerutil import run_burst

NO_BACKOFF = {"RETRY_BACKOFF_BASE": 0}


def test_a_retry_line_names_the_exception(live_store, child_env):
    task = enqueue("tests.flaky", {"succeed_on": 3}, max_attempts=3)
    out = run_burst(child_env, settings=NO_BACKOFF)
    assert get(task.id).status == "succeeded"
    for attempt in (1, 2):
        assert (
            f"Task tests.flaky {task.id} attempt {attempt}/3 failed (handler_error: "
            f"RuntimeError: flaky failure on attempt {attempt}) in "
        ) in out, out
    assert out.count("; retrying in ") == 2, out


def test_a_final_failure_says_why_it_is_final(live_store, child_env):
    permanent = enqueue("tests.permanent")
    used_up = enqueue("tests.flaky", {"succeed_on": 99}, max_attempts=2)
    out = run_burst(child_env, settings=NO_BACKOFF)
    assert (
        f"Task tests.permanent {permanent.id} attempt 1/3 failed (bad_input: TaskError: "
        "The input is not acceptable.) in "
    ) in out, out
    assert "; not retryable, so final." in out, out
    assert (
        f"Task tests.flaky {used_up.id} attempt 2/2 failed (handler_error: RuntimeError: "
        "flaky failure on attempt 2) in "
    ) in out, out
    assert "; no attempt left." in out, out


def test_a_manual_retry_that_keeps_the_count_is_not_shown_as_4_of_3(live_store, child_env):
    task = enqueue("tests.flaky", {"succeed_on": 99}, max_attempts=2)
    run_burst(child_env, settings=NO_BACKOFF)
    assert get(task.id).status == "failed"
    retry(task.id)  # as the admin's "Retry": the attempt count is kept
    out = run_burst(child_env, settings=NO_BACKOFF)
    assert get(task.id).attempt == 3
    assert "3/2" not in out, out
    assert f"Task tests.flaky {task.id} attempt 3 (max 2, retried by hand) started." in out
    assert "attempt 3 (max 2, retried by hand) failed (handler_error: RuntimeError: " in out
    assert "; no attempt left." in out, out


def test_attempt_labels():
    from cairnq_django.records import attempt_label

    assert attempt_label(1, 3) == "1/3"
    assert attempt_label(3, 3) == "3/3"
    assert attempt_label(4, 3) == "4 (max 3, retried by hand)"


def test_an_error_is_described_on_one_line():
    from cairnq_django.worker.execution import describe_error

    envelope = {"code": "handler_error", "type": "ConnectionError",
                "message": "upstream timed out\nmore detail", "retryable": True}
    assert describe_error(envelope) == "handler_error: ConnectionError: upstream timed out …"
    assert describe_error({"code": "c", "type": "T", "message": ""}) == "c: T"
    long = describe_error({"code": "c", "type": "T", "message": "x" * 1000})
    assert len(long) < 320 and long.endswith("…")


def test_the_admin_shows_an_attempt_past_max_as_a_manual_retry(admin_client, store):
    failed = make(store, "failed", name="a", max_attempts=1)
    store.retry(failed.id)  # kept count: the next claim is attempt 2 of max 1
    store.claim(queues=["default"], worker_id="w1", lease_ms=30_000, names=["a"], limit=1)
    html = admin_client.get("/admin/cairnq_django/task/").content.decode()
    assert "2 (max 1, retried by hand)" in html
    assert "2/1" not in html
