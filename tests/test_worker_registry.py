"""Handler registration, autodiscovery, retry backoff and error envelopes."""

import pytest

from cairnq_django import TaskError, register, task
from cairnq_django.worker import Registry, autodiscover, registry
from cairnq_django.worker.backoff import retry_delay_ms
from cairnq_django.worker.envelopes import as_envelope, exception_envelope
from cairnq_django.worker.heartbeat import heartbeat_interval_ms


@pytest.fixture
def scratch():
    """Forget the names a test registers in the process-wide registry."""
    before = set(registry.handlers)
    yield
    for name in set(registry.handlers) - before:
        registry.unregister(name)


def test_bare_decorator_uses_the_function_name(scratch):
    @task
    def send_welcome(ctx, payload):
        return None

    reg = registry.get("send_welcome")
    assert reg.fn is send_welcome and not reg.is_async
    assert reg.batch is None and reg.concurrency is None
    assert send_welcome.task_name == "send_welcome"


def test_named_decorator_with_options(scratch):
    @task("emails.send", batch=10, concurrency=2, max_attempts=5, queue="mail")
    async def send(ctxs):
        return None

    reg = registry.get("emails.send")
    assert reg.is_async
    assert (reg.batch, reg.concurrency, reg.max_attempts, reg.queue) == (10, 2, 5, "mail")
    assert reg.draws_alone


def test_imperative_register(scratch):
    def handler(ctx, payload):
        return payload

    reg = register("reports.build", handler, max_attempts=1)
    assert registry.get("reports.build") is reg and reg.max_attempts == 1


def test_a_name_cannot_be_taken_by_a_second_function(scratch):
    register("dup.name", lambda ctx, payload: 1)
    with pytest.raises(ValueError, match="already registered"):

        def other(ctx, payload):
            return 2

        register("dup.name", other)


def test_invalid_options_are_refused():
    scratch_registry = Registry()
    with pytest.raises(ValueError, match="batch for task 'x' must be an integer >= 1"):
        scratch_registry.register("x", lambda ctx, p: None, batch=0)
    with pytest.raises(ValueError, match="non-empty string"):
        scratch_registry.register("", lambda ctx, p: None)
    with pytest.raises(TypeError, match="must be callable"):
        scratch_registry.register("y", "not a function")
    with pytest.raises(ValueError, match="Cannot derive a task name"):
        task(lambda ctx, p: None)


def test_autodiscover_imports_app_tasks_modules():
    autodiscover()
    for name in ("tests.echo", "tests.batch", "tests.async_echo", "tests.limited"):
        assert name in registry
    assert registry.get("tests.batch").batch == 4
    assert registry.get("tests.limited").concurrency == 1


def test_backoff_is_equal_jitter_exponential():
    def delay(attempt, r, base=1000, cap=30000):
        return retry_delay_ms(attempt, base_ms=base, cap_ms=cap, rand=lambda: r)

    assert [delay(a, 0.0) for a in (1, 2, 3, 4)] == [500, 1000, 2000, 4000]
    assert delay(1, 0.999) == 999
    assert delay(20, 0.0) == 15000 and delay(20, 0.999) < 30000
    assert delay(3, 0.5, base=0) == 0


def test_heartbeat_interval_is_a_third_of_the_lease_with_a_floor():
    assert heartbeat_interval_ms(30000) == 10000
    assert heartbeat_interval_ms(90) == 50


def test_envelopes():
    envelope, retryable = as_envelope(
        TaskError("quota", "Over quota.", retryable=True, details={"limit": 3}), False
    )
    assert retryable is True
    assert envelope == {
        "type": "TaskError", "code": "quota", "message": "Over quota.",
        "retryable": True, "details": {"limit": 3},
    }
    try:
        raise KeyError("missing")
    except KeyError as exc:
        envelope = exception_envelope(exc)
    assert envelope["type"] == "KeyError" and envelope["code"] == "handler_error"
    assert envelope["retryable"] is True
    assert "Traceback" in envelope["details"]["traceback"]
    envelope, retryable = as_envelope("no source records", False)
    assert envelope["message"] == "no source records" and retryable is False
