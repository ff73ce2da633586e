"""CairnQBackend for Django's Tasks framework: enqueue, validation, results (no worker).

Runs on Django 6.x (`django.tasks`) and on Django 5.2 with the django-tasks
backport; tests/test_tasks_backend_worker.py runs the tasks in worker processes.
"""

import sys
from datetime import timedelta
from decimal import Decimal
from uuid import uuid4

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

import cairnq_django
from cairnq_django import compat

pytestmark = pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed")

if compat.AVAILABLE:
    from cairnq_django.backends import CairnQBackend
    from cairnq_django.backends.results import to_result
    from tests.tasksapp import tasks


def test_enqueue_writes_a_row_and_returns_a_ready_result(store):
    result = tasks.add.enqueue(2, b=3)

    assert result.status == compat.TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert result.enqueued_at is not None and result.started_at is None
    assert result.finished_at is None and result.worker_ids == [] and result.errors == []
    row = cairnq_django.get(result.id)
    assert row.name == "tests.tasksapp.tasks.add"
    assert row.payload == {"args": [2], "kwargs": {"b": 3}}
    assert (row.queue, row.priority, row.max_attempts, row.status) == ("default", 0, 1, "queued")
    with pytest.raises(ValueError, match="not finished yet"):
        _ = result.return_value


def test_task_options_reach_the_row(store):
    result = tasks.echo.enqueue("x")
    row = cairnq_django.get(result.id)
    assert (row.queue, row.priority) == ("tasks-other", 10)
    assert cairnq_django.get(tasks.fail_until.enqueue(1).id).max_attempts == 3
    assert cairnq_django.get(tasks.greet.enqueue("ann").id).name == "tests.shared_greet"


def test_enqueue_joins_the_callers_transaction(store):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            rolled_back = tasks.add.enqueue(1, 1)
            raise RuntimeError("roll back")
    with transaction.atomic():
        kept = tasks.add.enqueue(1, 2)
    assert cairnq_django.get(rolled_back.id) is None
    assert cairnq_django.get(kept.id) is not None


def test_arguments_must_be_json(store):
    before = len(cairnq_django.list_tasks())
    with pytest.raises(TypeError, match="positional argument 0 is an object"):
        tasks.add.enqueue(object(), 1)
    with pytest.raises(cairnq_django.SerializationError, match="positional argument 1 is nan"):
        tasks.add.enqueue(1, float("nan"))
    assert len(cairnq_django.list_tasks()) == before
    # What JSON can say is normalized the framework's way: tuples become lists.
    assert tasks.echo.enqueue((1, 2)).args == [[1, 2]]


def _user():
    from django.contrib.auth.models import User

    return User(pk=7, username="ann")


@pytest.mark.parametrize(
    ("args", "kwargs", "where", "instead"),
    [
        ((), {"order": _user}, "keyword argument 'order' is a django.contrib.auth.models.User "
         "model instance", "use its pk instead"),
        ((lambda: timezone.now(),), {}, "positional argument 0 is a datetime.datetime",
         "use its isoformat() string instead"),
        ((1, lambda: Decimal("9.99")), {}, "positional argument 1 is a decimal.Decimal",
         "use str(value) instead"),
        ((), {"ids": lambda: [1, {"id": uuid4()}]},
         "keyword argument 'ids' (at [1]['id']) is a uuid.UUID", "use str(value) instead"),
    ],
)
def test_a_non_json_argument_is_named_with_what_to_pass_instead(
    store, args, kwargs, where, instead
):
    args = [a() if callable(a) else a for a in args]
    kwargs = {k: v() for k, v in kwargs.items()}
    with pytest.raises(TypeError) as info:
        tasks.echo.enqueue(*args, **kwargs)
    message = str(info.value)
    # Django's own words first (normalize_json's "Unsupported type: <class ...>"), then ours.
    assert message.startswith("Unsupported type: <class '")
    assert f">. The arguments of tests.tasksapp.tasks.echo must be JSON: {where};" in message
    assert instead in message
    assert "Arguments may hold only JSON values" in message
    assert cairnq_django.list_tasks(name="tests.tasksapp.tasks.echo") == []


def test_the_plain_enqueue_says_the_same_of_its_payload(store):
    with pytest.raises(cairnq_django.SerializationError) as info:
        cairnq_django.enqueue("tests.echo", {"when": timezone.now()})
    assert str(info.value).startswith(
        "Object of type datetime is not JSON serializable. "
        "The task payload is not JSON-serializable: payload['when'] is a datetime.datetime; "
        "use its isoformat() string instead"
    )


def test_unknown_queue_is_refused(store):
    config = {
        "BACKEND": "cairnq_django.backends.CairnQBackend", "QUEUES": ["default", "tasks-other"]
    }
    with override_settings(TASKS={"default": config}):
        with pytest.raises(compat.InvalidTask, match="Queue 'nope' is not valid for backend."):
            tasks.add.using(queue_name="nope")
        other = tasks.add.using(queue_name="tasks-other").enqueue(1, 1)
    assert cairnq_django.get(other.id).queue == "tasks-other"


@pytest.mark.parametrize("priority", [-101, 101, 1.5])
def test_priority_outside_the_framework_range_is_refused(store, priority):
    with pytest.raises(compat.InvalidTask, match="priority must be a whole number between -100 and 100"):
        tasks.add.using(priority=priority)


def test_priority_keeps_its_order_in_the_queue(store):
    ids = {p: tasks.add.using(priority=p).enqueue(0, p).id for p in (-100, 0, 100, -5, 50)}
    assert {p: cairnq_django.get(i).priority for p, i in ids.items()} == {
        p: p for p in ids
    }
    claimed = store.claim(queues=["default"], worker_id="w", limit=5)
    assert [row.id for row in claimed] == [ids[p] for p in (100, 50, 0, -5, -100)]


def test_run_after_becomes_the_run_time(store):
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    row = cairnq_django.get(result.id)
    assert abs(row.run_at_ms - later.timestamp() * 1000) < 1_000
    assert store.claim(queues=["default"], worker_id="w", limit=5) == []


def test_run_after_must_be_aware(store):
    naive = timezone.now().replace(tzinfo=None)
    with pytest.raises(compat.InvalidTask, match="run_after must be an aware datetime."):
        tasks.add.using(run_after=naive)


def test_takes_context_needs_a_context_argument():
    def no_context(x):
        return x

    no_context.__qualname__ = "no_context"  # module-level, as far as the check can tell
    with pytest.raises(compat.InvalidTask, match="first argument of 'context'"):
        compat.task(takes_context=True)(no_context)


def test_cairnq_options_are_validated():
    with pytest.raises(compat.InvalidTask, match="max_attempts must be an integer >= 1"):
        tasks.add.using(max_attempts=0)
    with pytest.raises(compat.InvalidTask, match="Unknown conflict strategy 'merge'"):
        tasks.add.using(conflict="merge")


def test_a_key_with_a_conflict_strategy(store):
    first = tasks.add.using(key="sum:1").enqueue(1, 1)
    assert tasks.add.using(key="sum:1").enqueue(1, 1).id == first.id  # reuse
    with pytest.raises(cairnq_django.AlreadyExists):
        tasks.add.using(key="sum:1", conflict="reject").enqueue(1, 1)


def test_async_tasks_and_the_async_api(store):
    async def run():
        result = await tasks.async_add.aenqueue(1, 2)
        fetched = await tasks.async_add.aget_result(result.id)
        return result, fetched

    result, fetched = async_to_sync(run)()
    assert fetched.id == result.id and fetched.args == [1, 2]
    assert cairnq_django.get(result.id).name == "tests.tasksapp.tasks.async_add"


def test_get_result_reads_the_row(store):
    result = tasks.add.enqueue(4, 5)
    fetched = tasks.add.get_result(result.id)
    assert (fetched.id, fetched.task, fetched.args) == (result.id, tasks.add, [4, 5])
    assert compat.task_backends["default"].get_result(result.id).status == "READY"


def test_get_result_of_an_unknown_id_raises(store):
    backend = compat.task_backends["default"]
    with pytest.raises(compat.TaskResultDoesNotExist):
        backend.get_result("task_00000000000000000000000000")
    with pytest.raises(compat.TaskResultDoesNotExist):
        tasks.add.get_result("nope")


def test_get_result_of_a_row_that_is_no_framework_task_raises(store):
    plain = cairnq_django.enqueue("tests.echo", {"x": 1})
    with pytest.raises(compat.TaskResultDoesNotExist):
        compat.task_backends["default"].get_result(plain.id)


def test_get_result_never_imports_the_path_a_row_names(store):
    module = "tests.tasksapp.undiscovered"
    sys.modules.pop(module, None)
    row = cairnq_django.enqueue(f"{module}.side_effect", {"args": [], "kwargs": {}})
    with pytest.raises(compat.TaskResultDoesNotExist):
        compat.task_backends["default"].get_result(row.id)
    assert module not in sys.modules


def test_get_result_of_another_task_is_a_mismatch(store):
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(compat.TaskResultMismatch):
        tasks.boom.get_result(result.id)


def test_a_canceled_task_reads_as_failed_and_keeps_its_status(store):
    result = tasks.add.enqueue(1, 1)
    cairnq_django.cancel(result.id)
    result.refresh()
    assert result.status == compat.TaskResultStatus.FAILED and result.is_finished
    assert [e.exception_class_path for e in result.errors] == ["cairnq_django.errors.TaskCanceled"]
    assert result.errors[0].exception_class is cairnq_django.TaskCanceled
    assert cairnq_django.get(result.id).status == "canceled"
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_the_row_maps_onto_the_result(store):
    result = tasks.add.enqueue(1, 2)
    row = store.claim(queues=["default"], worker_id="worker_a", limit=1)[0]
    done = store.complete(row.id, "worker_a", 3)
    mapped = to_result(tasks.add, done, "default")
    assert mapped.status == compat.TaskResultStatus.SUCCESSFUL and mapped.return_value == 3
    assert mapped.finished_at is not None and mapped.worker_ids == ["worker_a"]
    assert mapped.attempts == 1
    result.refresh()
    assert result.status == compat.TaskResultStatus.SUCCESSFUL and result.return_value == 3


def test_enqueue_sends_task_enqueued(store):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id))

    compat.task_enqueued.connect(receiver)
    try:
        result = tasks.add.enqueue(1, 1)
    finally:
        compat.task_enqueued.disconnect(receiver)
    assert seen == [(CairnQBackend, result.id)]


def test_capabilities():
    backend = compat.task_backends["default"]
    assert isinstance(backend, CairnQBackend)
    assert (backend.supports_defer, backend.supports_async_task) == (True, True)
    assert (backend.supports_get_result, backend.supports_priority) == (True, True)


def test_check_reports_bad_options():
    config = {
        "default": {
            "BACKEND": "cairnq_django.backends.CairnQBackend",
            "OPTIONS": {"MAX_ATEMPTS": 2, "DATABASE": "elsewhere", "MODULES": ["no.such.module"]},
        }
    }
    with override_settings(TASKS=config):
        ids = [e.id for e in compat.task_backends["default"].check()]
    assert ids == ["cairnq.E101", "cairnq.E102", "cairnq.E104"]
    with override_settings(TASKS={"default": {**config["default"], "OPTIONS": {}}}):
        assert compat.task_backends["default"].check() == []


def test_manage_py_check_runs_the_backends_check(db):
    from django.core import checks

    config = {
        "default": {
            "BACKEND": "cairnq_django.backends.CairnQBackend",
            "OPTIONS": {"MAX_ATTEMPTS": 0},
        }
    }
    with override_settings(TASKS=config):
        found = [m.id for m in checks.run_checks() if m.id.startswith("cairnq.E10")]
    assert found == ["cairnq.E103"]


def test_check_reports_the_app_missing_from_installed_apps(db):
    from django.conf import settings
    from django.core import checks

    without = [app for app in settings.INSTALLED_APPS if app != "cairnq_django"]
    with override_settings(INSTALLED_APPS=without):
        found = [m for m in checks.run_checks() if m.id == "cairnq.E105"]
        assert compat.task_backends["default"].check()[0].id == "cairnq.E105"
    [error] = found
    assert error.level == checks.ERROR
    assert error.msg == (
        "TASKS['default'] uses CairnQBackend, but 'cairnq_django' is not in INSTALLED_APPS."
    )
    assert "Add 'cairnq_django' to INSTALLED_APPS" in error.hint
    assert not [m for m in checks.run_checks() if m.id == "cairnq.E105"]


def test_enqueue_without_the_app_says_to_install_it(db):
    from django.conf import settings

    from cairnq_django.store import executor

    # A process that never had the app has never verified its tables.
    for alias in settings.DATABASES:
        executor.forget_verified(alias)
    without = [app for app in settings.INSTALLED_APPS if app != "cairnq_django"]
    with override_settings(INSTALLED_APPS=without):
        with pytest.raises(cairnq_django.CairnQError) as info:
            tasks.add.enqueue(1, 2)
    assert str(info.value) == (
        "cairnq_django is not in INSTALLED_APPS, so it has no tables to use: add "
        "'cairnq_django' to INSTALLED_APPS, then run "
        "`manage.py migrate cairnq_django --database default`."
    )


def test_the_admin_shows_a_framework_task_as_its_call(admin_client, store):
    from django.urls import reverse

    result = tasks.echo.enqueue(1, "two", flag={"x": None})
    page = admin_client.get(reverse("admin:cairnq_django_task_change", args=[result.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Django task" in text
    assert (
        "<code>tests.tasksapp.tasks.echo(1, &quot;two&quot;, flag={&quot;x&quot;: null})</code>"
        in text
    )
    plain = cairnq_django.enqueue("tests.echo", {"args": [], "kwargs": {}})
    other = admin_client.get(reverse("admin:cairnq_django_task_change", args=[plain.id]))
    assert "Django task" not in other.content.decode()


def _decorator_takes_options():
    import inspect

    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        for p in inspect.signature(compat.task).parameters.values()
    )


@pytest.mark.skipif(
    not compat.AVAILABLE or not _decorator_takes_options(),
    reason="Django 6.0's @task takes no backend options",
)
def test_the_decorator_takes_cairnq_options(store):
    from tests.tasksapp.decorated import decorated

    row = cairnq_django.get(decorated.enqueue().id)
    assert (row.name, row.max_attempts) == ("tests.decorated", 4)
    assert decorated.conflict == "reject"


def test_the_on_commit_option_writes_the_row_after_the_commit(
    store, django_capture_on_commit_callbacks
):
    config = {"BACKEND": "cairnq_django.backends.CairnQBackend", "OPTIONS": {"ON_COMMIT": True}}
    with override_settings(TASKS={"default": config}):
        with django_capture_on_commit_callbacks(execute=True):
            result = tasks.add.enqueue(1, 1)
            assert (result.status, result.enqueued_at) == ("READY", None)
            assert cairnq_django.get(result.id) is None
    assert cairnq_django.get(result.id).payload == {"args": [1, 1], "kwargs": {}}


@pytest.mark.parametrize(
    "setting",
    [{"OPTIONS": {"ON_COMMIT": True}}, {"CAIRNQ": {"ENQUEUE_ON_COMMIT": True}}],
    ids=["OPTIONS", "ENQUEUE_ON_COMMIT"],
)
def test_with_on_commit_task_enqueued_is_sent_when_the_row_is_written(
    live_store, caplog, setting
):
    config = {
        "BACKEND": "cairnq_django.backends.CairnQBackend", "OPTIONS": setting.get("OPTIONS", {})
    }
    seen = []

    def receiver(sender, task_result, **kwargs):
        # What a receiver reads when it looks the task up: the row.
        seen.append((task_result.id, cairnq_django.get(task_result.id) is not None))

    framework_logger = "django.tasks" if compat.SOURCE == "django.tasks" else "django_tasks"
    caplog.set_level("DEBUG", logger=framework_logger)
    compat.task_enqueued.connect(receiver)
    try:
        with override_settings(TASKS={"default": config}, CAIRNQ=setting.get("CAIRNQ", {})):
            with pytest.raises(RuntimeError):
                with transaction.atomic():
                    rolled_back = tasks.add.enqueue(1, 1)
                    raise RuntimeError("roll back")
            with transaction.atomic():
                committed = tasks.add.enqueue(1, 2)
                assert seen == []
    finally:
        compat.task_enqueued.disconnect(receiver)
    assert cairnq_django.get(rolled_back.id) is None
    assert seen == [(committed.id, True)]
    logged = [r.getMessage() for r in caplog.records if "enqueued" in r.getMessage()]
    assert [line.split()[1] for line in logged] == [f"id={committed.id}"]


def test_progress_and_message_reach_framework_metadata_where_it_exists(store, monkeypatch):
    """Django's main branch adds TaskResult.metadata; a stand-in with that field here."""
    from dataclasses import dataclass, field

    @dataclass(frozen=True, slots=True, kw_only=True)
    class ResultWithMetadata(compat.TaskResult):
        metadata: dict = field(default_factory=dict)

    monkeypatch.setattr(compat, "TaskResult", ResultWithMetadata)
    monkeypatch.setattr(compat, "HAS_METADATA", True)
    queued = tasks.add.enqueue(1, 1)
    assert queued.metadata == {"_progress": None, "_message": None}
    row = store.claim(queues=["default"], worker_id="w", limit=1)[0]
    row = store.progress(row.id, "w", 0.5, "half way")
    assert to_result(tasks.add, row, "default").metadata == {
        "_progress": 0.5, "_message": "half way"
    }


def test_a_default_worker_serves_every_backend_queue():
    """A queue reached only through .using(queue_name=...) is served when QUEUES lists it."""
    from cairnq_django.worker import Worker

    config = {
        "default": {
            "BACKEND": "cairnq_django.backends.CairnQBackend",
            "QUEUES": ["default", "tasks-other", "only-via-using"],
        }
    }
    with override_settings(TASKS=config, CAIRNQ={"QUEUES": ["default"]}):
        assert compat.task_backends["default"].check() == []
        worker = Worker()
        assert {"default", "tasks-other", "only-via-using"} <= set(worker.queues)
        assert Worker(queues=["mine"]).queues == ["mine"]


@pytest.mark.parametrize("task_name", ["add", "async_add"])
def test_an_attempt_whose_lease_ran_out_records_nothing_and_does_not_run(store, task_name):
    """The attempt log is an owned write: a lease past its expiry writes it no more than a lost one."""
    from cairnq_django import LostLease
    from cairnq_django.backends.definitions import row_name
    from cairnq_django.backends.handlers import AsyncTaskHandler, TaskHandler
    from cairnq_django.worker import TaskContext
    from tests.storeutil import expire_lease

    task = getattr(tasks, task_name)
    queued = task.enqueue(1, 2)
    [row] = store.claim(queues=[task.queue_name], worker_id="w-stale", names=[row_name(task)])
    expire_lease(store, row.id)
    ctx = TaskContext(store=store, task=row, worker_id="w-stale", lease_ms=30_000)
    if task_name == "add":
        with pytest.raises(LostLease):
            TaskHandler(task)(ctx, row.payload)
    else:
        with pytest.raises(LostLease):
            async_to_sync(AsyncTaskHandler(task))(ctx, row.payload)
    assert ctx.lost_lease
    after = cairnq_django.get(queued.id)
    assert after.metadata == row.metadata and "_django_task_attempts" not in after.metadata


def test_a_datetime_argument_keeps_djangos_words_first(store):
    """Code (and Django's own test suites) matching normalize_json's message still match."""
    with pytest.raises(TypeError) as info:
        tasks.echo.enqueue(when=timezone.now())
    assert str(info.value).startswith("Unsupported type: <class 'datetime.datetime'>. ")
    assert "keyword argument 'when' is a datetime.datetime" in str(info.value)


def test_a_task_sent_through_a_second_alias_reads_back_through_it(store):
    """Two CairnQ aliases over one database: `.using(backend=...)` results refresh and look up."""
    config = {"BACKEND": "cairnq_django.backends.CairnQBackend"}
    with override_settings(TASKS={"default": config, "other": config}):
        result = tasks.add.using(backend="other").enqueue(2, 3)
        assert result.backend == "other"
        result.refresh()
        found = tasks.add.using(backend="other").get_result(result.id)
        assert (found.id, found.backend, found.task.backend) == (result.id, "other", "other")
        assert found.args == [2, 3]


def test_the_frameworks_failure_log_line_carries_the_tasks_exception(store, caplog):
    """Django's task_finished receiver logs sys.exc_info(): the signal is sent while handling it."""
    import django

    from cairnq_django.backends.definitions import row_name
    from cairnq_django.backends.handlers import TaskHandler
    from cairnq_django.testing import run_tasks
    from cairnq_django.worker.registry import Registry

    # The framework's logger: django.tasks on Django 6, django_tasks in the 5.2 backport.
    framework_logger = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    registry = Registry()
    registry.register(row_name(tasks.boom), TaskHandler(tasks.boom))
    with (caplog.at_level("INFO", logger=framework_logger),
          run_tasks(registry=registry, raise_exceptions=False) as runner):
        result = tasks.boom.enqueue("no luck")
        runner.drain()
    [line] = [r for r in caplog.records if r.name == framework_logger and r.levelname == "ERROR"]
    assert result.id in line.getMessage() and "FAILED" in line.getMessage()
    assert line.exc_info is not None and line.exc_info[0] is ValueError
    assert str(line.exc_info[1]) == "no luck"
