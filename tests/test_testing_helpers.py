"""cairnq_django.testing: drain and inline modes, inside the test's transaction."""

import pytest
from django.db import transaction
from django.test import TestCase, override_settings

import cairnq_django
from cairnq_django import compat
from cairnq_django.testing import (  # noqa: F401  (the fixtures are used by name)
    TaskRunner,
    cairnq_tasks,
    cairnq_tasks_inline,
    run_tasks,
)
from cairnq_django.worker.registry import registry


@pytest.fixture(autouse=True)
def framework_tasks():
    """Discover tests.tasksapp's framework tasks for these tests only."""
    if not compat.AVAILABLE:
        yield
        return
    from django.conf import settings

    from cairnq_django.backends.handlers import TaskHandler

    config = {**settings.TASKS["default"], "OPTIONS": {"MODULES": ["tests.tasksapp.tasks"]}}
    with override_settings(TASKS={"default": config}):
        yield
    # Other tests' in-process workers should not serve these names.
    for name, registration in list(registry.handlers.items()):
        if isinstance(registration.fn, TaskHandler):
            registry.unregister(name)


def test_drain_runs_what_was_enqueued(cairnq_tasks):
    first = cairnq_django.enqueue("tests.echo", {"n": 1})
    second = cairnq_django.enqueue("tests.echo", {"n": 2})
    assert cairnq_django.get(first.id).status == "queued"  # nothing runs before drain()

    ran = cairnq_tasks.drain()

    # Tasks due in the same millisecond run in id order, which is random within it.
    assert sorted((r.task.id, r.task.payload["n"]) for r in ran) == sorted(
        [(first.id, 1), (second.id, 2)]
    )
    assert all(r.task.result == {"echo": r.task.payload, "attempt": 1} for r in ran)
    assert cairnq_django.get(first.id).status == "succeeded"
    assert cairnq_tasks.drain() == []


def test_drain_leaves_later_tasks_and_if_allowed_names_without_a_handler(cairnq_tasks):
    stray = cairnq_django.enqueue("no.such.handler")
    later = cairnq_django.enqueue("tests.echo", delay=60_000)
    cairnq_tasks.allow_unhandled = True  # else drain() raises UnhandledTask (below)
    assert cairnq_tasks.drain() == []
    assert cairnq_django.get(stray.id).status == "queued"
    assert cairnq_django.get(later.id).status == "queued"


def test_a_failure_is_final_without_retries_and_recorded(cairnq_tasks):
    task = cairnq_django.enqueue("tests.flaky", {"succeed_on": 2}, max_attempts=3)
    [attempt] = cairnq_tasks.drain()
    assert attempt.status == "failed" and attempt.task.attempt == 1
    assert isinstance(attempt.exception, RuntimeError)
    assert cairnq_django.get(task.id).error["code"] == "handler_error"


def test_raise_exceptions_reraises_the_handlers_error(cairnq_tasks):
    cairnq_django.enqueue("tests.permanent")
    with pytest.raises(cairnq_django.TaskError, match="The input is not acceptable."):
        cairnq_tasks.drain(raise_exceptions=True)


def test_retries_run_again_at_once(db):
    task = cairnq_django.enqueue("tests.flaky", {"succeed_on": 2}, max_attempts=3)
    with run_tasks(retries=True) as tasks:
        ran = tasks.drain()
    assert [r.status for r in ran] == ["queued", "succeeded"]
    assert cairnq_django.get(task.id).result == {"attempt": 2}


def test_inline_runs_at_once_outside_a_transaction(cairnq_tasks_inline):
    task = cairnq_django.enqueue("tests.echo", {"n": 1})
    assert cairnq_django.get(task.id).status == "succeeded"
    assert [r.task.id for r in cairnq_tasks_inline.ran] == [task.id]


def test_inline_waits_for_the_transaction_to_commit(
    cairnq_tasks_inline, django_capture_on_commit_callbacks
):
    # Inside the test's transaction nothing commits: the capture runs what
    # would run at a commit, as it does for any on_commit callback.
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            task = cairnq_django.enqueue("tests.echo", {"n": 1})
            with transaction.atomic():
                pass  # an inner block that commits is not the transaction's end
            assert cairnq_django.get(task.id).status == "queued"
        assert cairnq_django.get(task.id).status == "queued"  # no commit yet
    assert cairnq_django.get(task.id).status == "succeeded"


def test_inline_never_runs_a_task_whose_block_rolled_back(
    cairnq_tasks_inline, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                cairnq_django.enqueue("tests.echo", {"n": "rolled back"})
                raise RuntimeError("roll back")
        with transaction.atomic():
            kept = cairnq_django.enqueue("tests.echo", {"n": "kept"})
            try:
                with transaction.atomic():
                    cairnq_django.enqueue("tests.echo", {"n": "savepoint rolled back"})
                    raise RuntimeError("roll back the savepoint only")
            except RuntimeError:
                pass
    assert [r.task.id for r in cairnq_tasks_inline.ran] == [kept.id]
    assert [t.payload["n"] for t in cairnq_django.list_tasks()] == ["kept"]


def test_inline_runs_enqueue_many_and_children(cairnq_tasks_inline):
    rows = cairnq_django.enqueue_many([("tests.echo", {"n": 1}), ("tests.echo", {"n": 2})])
    assert {cairnq_django.get(r.id).status for r in rows} == {"succeeded"}


def test_inline_exceptions_are_raised_at_the_end_when_asked(db):
    with pytest.raises(cairnq_django.TaskError):
        with run_tasks(inline=True, raise_exceptions=True):
            cairnq_django.enqueue("tests.permanent")
            # The enqueue itself did not raise: the error surfaces here.
    with run_tasks(inline=True) as tasks:
        cairnq_django.enqueue("tests.permanent")
    assert isinstance(tasks.ran[0].exception, cairnq_django.TaskError)


@pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed")
def test_framework_tasks_inline_and_drained(db):
    from tests.tasksapp import tasks

    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status))

    compat.task_finished.connect(receiver)
    try:
        with run_tasks(inline=True):
            inline = tasks.add.enqueue(1, 2)
            async_inline = tasks.async_add.enqueue(2, 2)
        with run_tasks() as runner:
            drained = tasks.fail_until.enqueue(attempt=1)
            failed = tasks.boom.enqueue("no")
            runner.drain()
    finally:
        compat.task_finished.disconnect(receiver)

    inline.refresh()
    assert inline.status == "SUCCESSFUL" and inline.return_value == 3
    assert tasks.async_add.get_result(async_inline.id).return_value == 4
    drained.refresh()
    assert drained.return_value["attempt"] == 1
    failed.refresh()
    assert failed.status == "FAILED"
    assert failed.errors[0].exception_class_path == "builtins.ValueError"
    assert finished[:2] == [(inline.id, "SUCCESSFUL"), (async_inline.id, "SUCCESSFUL")]
    assert sorted(finished[2:]) == sorted([(drained.id, "SUCCESSFUL"), (failed.id, "FAILED")])


def test_inline_after_a_real_commit(live_store):
    with run_tasks(inline=True) as tasks:
        with transaction.atomic():
            task = cairnq_django.enqueue("tests.echo", {"n": 1})
            assert cairnq_django.get(task.id).status == "queued"
        assert cairnq_django.get(task.id).status == "succeeded"
    assert len(tasks.ran) == 1


class DjangoTestCaseUsage(TestCase):
    """The helpers in a plain Django TestCase, as the docs show them."""

    def test_drain(self):
        runner = self.enterContext(run_tasks())
        task = cairnq_django.enqueue("tests.echo", {"n": 1})
        self.assertEqual([r.task.id for r in runner.drain()], [task.id])

    def test_inline(self):
        self.enterContext(run_tasks(inline=True))
        task = cairnq_django.enqueue("tests.echo", {"n": 1})  # no transaction of the code's own
        self.assertEqual(cairnq_django.get(task.id).status, "succeeded")

    def test_inline_in_the_codes_transaction(self):
        self.enterContext(run_tasks(inline=True))
        with self.captureOnCommitCallbacks(execute=True):
            with transaction.atomic():
                task = cairnq_django.enqueue("tests.echo", {"n": 1})
            self.assertEqual(cairnq_django.get(task.id).status, "queued")
        self.assertEqual(cairnq_django.get(task.id).status, "succeeded")


def test_a_runner_uses_the_registry_it_is_given(db):
    from cairnq_django.worker.registry import Registry

    only = Registry()
    only.register("only.this", lambda ctx, payload: "done")
    cairnq_django.enqueue("tests.echo")
    task = cairnq_django.enqueue("only.this")
    ran = TaskRunner(registry=only, allow_unhandled=True).drain()
    assert [r.task.id for r in ran] == [task.id]


@pytest.mark.parametrize(
    ("returned", "results"),
    [("ignored", [None, None]), ({"first": 1}, [1, None])],
    ids=["not a dict", "a dict by task id"],
)
def test_a_batch_handlers_return_settles_its_tasks_as_the_worker_does(db, returned, results):
    """docs/worker.md: only a {task_id: result} dict supplies a batch's results."""
    from cairnq_django.worker.registry import Registry

    only = Registry()
    only.register("only.batch", lambda ctxs: returned, batch=5)
    first = cairnq_django.enqueue("only.batch", {"n": 1})
    second = cairnq_django.enqueue("only.batch", {"n": 2})
    if isinstance(returned, dict):
        returned = {first.id: returned["first"]}
    TaskRunner(registry=only).drain()
    assert [cairnq_django.get(t.id).status for t in (first, second)] == ["succeeded"] * 2
    assert [cairnq_django.get(t.id).result for t in (first, second)] == results


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
def test_a_handler_raising_a_base_exception_fails_its_task_as_the_worker_does(db, raised):
    from cairnq_django.worker.registry import Registry

    def handler(ctx, payload):
        raise raised

    only = Registry()
    only.register("only.exits", handler)
    task = cairnq_django.enqueue("only.exits", max_attempts=1)
    [attempt] = TaskRunner(registry=only).drain()
    assert attempt.exception is raised
    assert cairnq_django.get(task.id).status == "failed"


# ------------------------------------------------ a task nothing handles
def test_drain_fails_loudly_on_a_task_nothing_handles(db):
    from cairnq_django.testing import UnhandledTask

    ok = cairnq_django.enqueue("tests.echo", {"n": 1})
    typo = cairnq_django.enqueue("tests.ecoh", {"n": 2})
    later = cairnq_django.enqueue("tests.ecoh", {"n": 3}, delay=3_600_000)
    with run_tasks() as tasks, pytest.raises(UnhandledTask) as raised:
        tasks.drain()
    # What has a handler still ran; the typo is named, with its id.
    assert cairnq_django.get(ok.id).status == "succeeded"
    assert [t.id for t in raised.value.tasks] == [typo.id]
    assert isinstance(raised.value, AssertionError)
    message = str(raised.value)
    assert f"1 queued task(s) have no handler here and would never run: 'tests.ecoh' ({typo.id})." in message
    assert "tests.echo" in message and "@cairnq_django.task" in message
    assert cairnq_django.get(later.id).status == "queued"  # not due: drain leaves it


def test_allow_unhandled_leaves_such_tasks_queued(db):
    typo = cairnq_django.enqueue("tests.ecoh")
    with run_tasks(allow_unhandled=True) as tasks:
        assert tasks.drain() == []
    assert cairnq_django.get(typo.id).status == "queued"


def test_inline_mode_fails_loudly_on_a_task_nothing_handles(db):
    from cairnq_django.testing import UnhandledTask

    with run_tasks(inline=True), pytest.raises(UnhandledTask, match="'tests.ecoh'"):
        cairnq_django.enqueue("tests.ecoh")


def test_inline_mode_raises_an_unhandled_task_met_at_commit_when_the_block_ends(
    db, django_capture_on_commit_callbacks
):
    from cairnq_django.testing import UnhandledTask

    # Django only logs what a robust on_commit callback raises; the runner
    # keeps it and fails the test with it.
    with pytest.raises(UnhandledTask, match="'tests.ecoh'"):
        with run_tasks(inline=True) as tasks:
            with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
                typo = cairnq_django.enqueue("tests.ecoh")
                ok = cairnq_django.enqueue("tests.echo", {"n": 1})
            assert cairnq_django.get(typo.id).status == "queued"
    # Each enqueue's callback is its own: the typo did not keep the other from running.
    assert [r.task.id for r in tasks.ran] == [ok.id]


def test_inline_mode_patches_nothing_and_listens_only_while_open(db):
    from cairnq_django import signals

    exit_before = transaction.Atomic.__exit__
    assert not signals.task_written.receivers
    with run_tasks(inline=True):
        assert transaction.Atomic.__exit__ is exit_before
        assert len(signals.task_written.receivers) == 1
        with run_tasks(inline=True):
            assert len(signals.task_written.receivers) == 1
    assert not signals.task_written.receivers
