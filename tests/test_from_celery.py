"""docs/from-celery.md: every example runs as written, and delay/apply_async behave as it says."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from cairnq_django import get, task
from cairnq_django.testing import run_tasks
from cairnq_django.worker.registry import registry

DOC = Path(__file__).resolve().parent.parent / "docs" / "from-celery.md"
WORKER_RUNS = "# ... a worker runs it ..."


def _examples() -> list[tuple[str, str]]:
    """(heading, code) for each ```python block, under the ## heading it follows."""
    text = DOC.read_text()
    found, heading = [], ""
    pattern = r"(^## [^\n]+$|^```python\n.*?^```$)"
    for part in re.split(pattern, text, flags=re.MULTILINE | re.DOTALL):
        if part.startswith("## "):
            heading = part[3:].strip()
        elif part.startswith("```python"):
            found.append((heading, part.removeprefix("```python\n").removesuffix("```")))
    return found


EXAMPLES = _examples()


@pytest.fixture
def clean_registry():
    """Forget the examples' handlers afterwards (and only them: a module imported meanwhile,
    such as tests.testapp.tasks through autodiscover, is not imported twice)."""
    yield
    for name in registry.names():
        if name.startswith("celerydoc."):
            registry.unregister(name)


def test_the_doc_has_an_example_for_each_idiom_section():
    headings = {heading for heading, _ in EXAMPLES}
    assert {
        "Handlers, delay and bind=True", "apply_async: countdown, eta, queue, priority", "expires",
        "Retries", "rate_limit", "beat schedules", "AsyncResult.get()",
    } <= headings


@pytest.mark.parametrize(("heading", "code"), EXAMPLES, ids=[h for h, _ in EXAMPLES])
def test_every_example_runs_as_written(transactional_db, clean_registry, settings, heading, code):
    # Committed, as in a project: wait() refuses to run inside an open transaction.
    with run_tasks(retries=True) as tasks:
        namespace: dict = {"__name__": "celerydoc"}
        exec(compile(code.replace(WORKER_RUNS, "tasks.drain()"), str(DOC), "exec"),  # noqa: S102
             {**namespace, "tasks": tasks})
        tasks.drain()
    if "CAIRNQ = " in code:
        # A settings example: the dict is what the project's checks accept.
        scope: dict = {}
        exec(compile(code, str(DOC), "exec"), scope)  # noqa: S102
        settings.CAIRNQ = scope["CAIRNQ"]
        from django.core import checks

        # E031 (no handler for a scheduled name) aside: the example's tasks are not defined.
        errors = [m for m in checks.run_checks()
                  if m.id.startswith("cairnq") and m.level >= checks.ERROR and m.id != "cairnq.E031"]
        assert errors == []


def test_the_retries_example_retries_then_succeeds_and_stops_on_a_non_retryable_error(
    db, clean_registry
):
    [code] = [code for heading, code in EXAMPLES if heading == "Retries"]
    with run_tasks(retries=True) as tasks:
        scope: dict = {"__name__": "celerydoc"}
        exec(compile(code.replace(WORKER_RUNS, ""), str(DOC), "exec"), scope)  # noqa: S102
        charge = scope["charge"]
        flaky = tasks.drain()
        stolen = charge.delay(card="stolen")
        busy = charge.delay(gateway="busy")
        tasks.drain()
    assert [ran.status for ran in flaky] == ["queued", "succeeded"]  # retried once, then done
    assert (get(stolen.id).status, get(stolen.id).attempt) == ("failed", 1)
    snoozed = get(busy.id)
    assert (snoozed.status, snoozed.attempt) == ("queued", 0)  # the attempt given back
    assert snoozed.run_at_ms >= snoozed.updated_at_ms + 29_000


# ------------------------------------------------------- delay and apply_async
@pytest.fixture
def remind(clean_registry):
    @task("celerydoc.test_remind", queue="reminders", max_attempts=2)
    def remind(ctx, payload):
        return payload

    return remind


def test_delay_sends_its_keywords_as_the_payload_with_the_handlers_options(db, remind):
    record = remind.delay(user="ada", times=2)
    assert (record.name, record.queue, record.max_attempts) == ("celerydoc.test_remind", "reminders", 2)
    assert get(record.id).payload == {"user": "ada", "times": 2}


def test_apply_async_maps_countdown_eta_queue_and_priority(db, remind):
    soon = remind.apply_async(kwargs={"user": "ada"}, countdown=90, queue="urgent", priority=7)
    assert (soon.queue, soon.priority, soon.max_attempts) == ("urgent", 7, 2)
    assert 90_000 <= soon.run_at_ms - soon.created_at_ms < 100_000
    eta = datetime.now(UTC) + timedelta(hours=2)
    later = remind.apply_async(kwargs={"user": "bob"}, eta=eta, key="remind:bob")
    assert abs(later.run_at_ms - int(eta.timestamp() * 1000)) < 1_000
    assert get(later.id).payload == {"user": "bob"}
    plain = remind.apply_async()
    assert get(plain.id).payload == {}


def test_apply_async_refuses_what_it_cannot_honour(db, remind):
    with pytest.raises(TypeError, match="tasks do not expire"):
        remind.apply_async(kwargs={}, expires=60)
    with pytest.raises(TypeError, match="Pass kwargs"):
        remind.apply_async(args=(1, 2))
    with pytest.raises(TypeError, match="not both"):
        remind.apply_async(countdown=5, eta=datetime.now(UTC))
    with pytest.raises(TypeError, match="countdown must be"):
        remind.apply_async(countdown="5")
    from cairnq_django.models import Task

    assert not Task.objects.exists()  # nothing was half-sent


@pytest.mark.slow
def test_delay_and_apply_async_tasks_run_in_a_real_worker(live_store, child_env):
    """Sent from here, run by a worker process: the handler gets the keywords as its payload."""
    from tests.testapp.tasks import echo
    from tests.workerutil import run_burst

    sent = echo.delay(value="from delay")
    applied = echo.apply_async(kwargs={"value": "applied"}, queue="celery", priority=3)
    run_burst(child_env, "--queue", "default", "--queue", "celery")
    assert get(sent.id).result == {"echo": {"value": "from delay"}, "attempt": 1}
    done = get(applied.id)
    assert (done.status, done.queue, done.priority) == ("succeeded", "celery", 3)
    assert done.result == {"echo": {"value": "applied"}, "attempt": 1}


# ------------------------------------------------- autoretry_for and retry_backoff
class Flaky(Exception):
    pass


@pytest.fixture
def picky(clean_registry):
    @task("celerydoc.test_picky", max_attempts=3, autoretry_for=(Flaky,), retry_backoff=5,
          retry_backoff_max=60)
    def picky(ctx, payload):
        raise Flaky("again") if payload["raise"] == "flaky" else ValueError("broken")

    return picky


def test_autoretry_for_retries_only_the_exceptions_it_names(db, picky):
    with run_tasks(retries=True, raise_exceptions=False) as tasks:
        flaky, broken = picky.delay(**{"raise": "flaky"}), picky.delay(**{"raise": "broken"})
        tasks.drain()
    # run_tasks retries at once: the named exception used every attempt, the other one.
    assert (get(flaky.id).status, get(flaky.id).attempt) == ("failed", 3)
    assert (get(broken.id).status, get(broken.id).attempt) == ("failed", 1)


def test_autoretry_for_leaves_a_task_error_its_own_say(db, clean_registry):
    from cairnq_django import TaskError

    @task("celerydoc.test_own_say", max_attempts=3, autoretry_for=(Flaky,))
    def own_say(ctx, payload):
        raise TaskError("busy", "Try later.", retryable=True)

    with run_tasks(retries=True, raise_exceptions=False) as tasks:
        sent = own_say.delay()
        tasks.drain()
    assert (get(sent.id).status, get(sent.id).attempt) == ("failed", 3)


@pytest.mark.parametrize(("options", "expected"), [
    ({}, None),
    ({"retry_backoff": True}, (1_000, 600_000)),
    ({"retry_backoff": 2, "retry_backoff_max": 30}, (2_000, 30_000)),
    ({"retry_backoff": False}, (0, 600_000)),
])
def test_retry_backoff_reads_as_in_celery(clean_registry, options, expected):
    registration = registry.register("celerydoc.test_backoff", lambda ctx, p: None, **options)
    assert registration.retry_backoff_ms == expected


@pytest.mark.parametrize(("options", "message"), [
    ({"autoretry_for": "ValueError"}, "autoretry_for for task 'celerydoc.test_bad' must be"),
    ({"autoretry_for": (ValueError, 3)}, "autoretry_for for task 'celerydoc.test_bad' must be"),
    ({"retry_backoff": -1}, "retry_backoff for task 'celerydoc.test_bad' must be a number"),
    ({"retry_backoff_max": 10}, "retry_backoff_max for task 'celerydoc.test_bad' needs"),
])
def test_bad_retry_options_are_refused_by_name(clean_registry, options, message):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        registry.register("celerydoc.test_bad", lambda ctx, p: None, **options)
    assert "celerydoc.test_bad" not in registry


@pytest.mark.slow
def test_a_worker_uses_the_handlers_backoff_and_autoretry_for(live_store, child_env):
    """A real worker: the named exception is retried after the handler's own backoff window."""
    from cairnq_django import enqueue
    from tests.workerutil import run_burst

    flaky = enqueue("tests.celery_picky", {"raise": "flaky"})
    broken = enqueue("tests.celery_picky", {"raise": "broken"})
    run_burst(child_env)
    retried, failed = get(flaky.id), get(broken.id)
    assert (failed.status, failed.attempt) == ("failed", 1)
    assert (retried.status, retried.attempt) == ("queued", 1)
    # retry_backoff=120: the first window is [60 s, 120 s), far past the worker's default 1 s.
    assert retried.run_at_ms - retried.updated_at_ms >= 60_000
