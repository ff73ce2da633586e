"""What a handler declares (queue, max_attempts, priority) holds for every enqueue by name (issue 32)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

import cairnq_django
from cairnq_django import declared, task
from cairnq_django.testing import run_tasks
from cairnq_django.worker import Registry, registry


@pytest.fixture
def charge_card():
    """A handler declaring all three row options, registered for the test only."""

    @task("shop.charge_card", max_attempts=2, queue="payments", priority=7)
    def charge(ctx, payload):
        raise RuntimeError("card declined")

    yield charge
    registry.unregister("shop.charge_card")


def options(row):
    return (row.queue, row.max_attempts, row.priority)


def test_enqueue_by_name_takes_the_declared_options(db, charge_card):
    row = cairnq_django.enqueue("shop.charge_card", {"order": 1})
    assert options(row) == ("payments", 2, 7)
    assert options(charge_card.enqueue({"order": 1})) == ("payments", 2, 7)


def test_explicit_arguments_win_option_by_option(db, charge_card):
    row = cairnq_django.enqueue("shop.charge_card", {}, max_attempts=5)
    assert options(row) == ("payments", 5, 7)
    row = cairnq_django.enqueue("shop.charge_card", {}, queue="default", priority=0)
    assert options(row) == ("default", 2, 0)


def test_a_name_registered_nowhere_here_takes_the_protocol_defaults(db):
    row = cairnq_django.enqueue("elsewhere.runs_this", {})
    assert options(row) == ("default", 3, 0)


def test_unregistering_forgets_the_declaration(db, charge_card):
    registry.unregister("shop.charge_card")
    assert options(cairnq_django.enqueue("shop.charge_card", {})) == ("default", 3, 0)


def test_a_private_registry_declares_nothing(db):
    private = Registry()
    private.register("private.only", lambda ctx, payload: None, max_attempts=9, queue="side")
    assert declared.row_options("private.only") == declared.RowOptions("default", 3, 0)
    assert options(cairnq_django.enqueue("private.only", {})) == ("default", 3, 0)


def test_enqueue_many_takes_them_for_pairs_and_dicts(db, charge_card):
    rows = cairnq_django.enqueue_many([
        ("shop.charge_card", {"order": 1}),
        {"name": "shop.charge_card", "payload": {"order": 2}, "priority": 1},
        ("other.task", {}),
    ])
    assert [options(row) for row in rows] == [
        ("payments", 2, 7), ("payments", 2, 1), ("default", 3, 0),
    ]


def test_the_async_twins_take_them(db, charge_card):
    row = async_to_sync(cairnq_django.aenqueue)("shop.charge_card", {})
    assert options(row) == ("payments", 2, 7)
    [many] = async_to_sync(cairnq_django.aenqueue_many)([("shop.charge_card", {})])
    assert options(many) == ("payments", 2, 7)


def test_on_commit_enqueue_reports_the_declared_queue(db, charge_card):
    pending = cairnq_django.enqueue("shop.charge_card", {}, on_commit=True)
    assert pending.queue == "payments"


def test_a_declared_priority_is_checked_when_registering():
    with pytest.raises(ValueError, match=r"priority for task 'bad.priority' must be an integer"):
        task("bad.priority", priority="high")(lambda ctx, payload: None)
    assert "bad.priority" not in registry


def test_max_attempts_declared_on_the_handler_limits_a_task_enqueued_by_name(db, charge_card):
    """The issue's case: enqueue("charge_card") ran 3 attempts although the handler said 2."""
    row = cairnq_django.enqueue("shop.charge_card", {"order": 1})
    with run_tasks(retries=True) as runner:
        runner.drain()
    done = cairnq_django.get(row.id)
    assert (done.status, done.attempt) == ("failed", 2)


def test_a_child_submitted_by_name_takes_the_declared_options(db, charge_card):
    @task("shop.checkout")
    def checkout(ctx, payload):
        return ctx.submit("shop.charge_card", {"order": 1}).id

    try:
        parent = cairnq_django.enqueue("shop.checkout", {})
        with run_tasks(allow_unhandled=True) as runner:
            runner.run_until_finished(parent.id)
    finally:
        registry.unregister("shop.checkout")
    child = cairnq_django.get(cairnq_django.get(parent.id).result)
    assert options(child) == ("payments", 2, 7)
