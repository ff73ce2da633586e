"""The claim planner on its own: no database, no threads."""

from __future__ import annotations

import pytest

from cairnq_django.records import TaskRecord
from cairnq_django.worker.planner import (
    Draw,
    Rotation,
    Source,
    any_draw_filled,
    build_sources,
    free_calls,
    plan_draws,
    select_handlers,
    served_queues,
    split_calls,
)
from cairnq_django.worker.registry import Registration


def reg(name, **options):
    return Registration(name=name, fn=lambda ctx, payload: None, is_async=False, **options)


def handlers(*registrations):
    return {r.name: r for r in registrations}


def row(name, n=0):
    return TaskRecord(
        id=f"{name}-{n}", name=name, queue="default", status="running", payload=None,
        result=None, error=None, metadata={}, progress=None, message=None, attempt=1,
        max_attempts=3, priority=0, worker_id="w", lease_until_ms=1, run_at_ms=0,
        cancel_requested_at_ms=None, parent_id=None, root_id=None, correlation_id=None,
        created_at_ms=0, updated_at_ms=0, completed_at_ms=None,
    )


SHARED = Source(("a", "b"), 1, None)
BATCHED = Source(("batch",), 10, None)
SERIAL = Source(("serial",), 1, 1)


def test_plain_names_share_one_source_and_the_others_draw_alone():
    sources = build_sources(
        handlers(reg("b"), reg("serial", concurrency=1), reg("a"), reg("batch", batch=10))
    )
    assert sources == (BATCHED, SERIAL, SHARED)


def test_no_handlers_no_sources():
    assert build_sources({}) == ()
    assert Rotation(()).next_order() == []


def test_each_poll_starts_with_the_next_source():
    rotation = Rotation((BATCHED, SERIAL, SHARED))
    orders = [rotation.next_order() for _ in range(4)]
    assert [order[0] for order in orders] == [BATCHED, SERIAL, SHARED, BATCHED]
    assert orders[1] == [SERIAL, SHARED, BATCHED]


def test_free_calls_counts_running_handlers_and_caps_unsettled_ones():
    assert free_calls(4, running=0, in_flight=0) == 4
    assert free_calls(4, running=1, in_flight=3) == 3  # two calls wait on their settle
    assert free_calls(4, running=0, in_flight=8) == 0  # settling hoards no more claims
    assert free_calls(4, running=4, in_flight=4) == 0


def test_free_calls_go_to_sources_in_order_within_their_headroom():
    draws = plan_draws(
        [SERIAL, BATCHED, SHARED], 4, concurrency=4, calls_by_name={"serial": 0}
    )
    assert draws == [Draw(SERIAL, 1), Draw(BATCHED, 3)]
    assert [d.limit for d in draws] == [1, 30]  # a batched call takes up to 10 tasks


def test_a_source_at_its_own_concurrency_is_skipped():
    draws = plan_draws([SERIAL, SHARED], 2, concurrency=4, calls_by_name={"serial": 1})
    assert draws == [Draw(SHARED, 2)]


def test_nothing_free_nothing_drawn():
    assert plan_draws([SHARED], 0, concurrency=4, calls_by_name={}) == []


def test_a_draw_that_got_its_whole_quota_may_have_left_work_behind():
    draws = [Draw(SHARED, 2), Draw(SERIAL, 1)]
    assert any_draw_filled(draws, [row("a"), row("b", 1)]) is True
    assert any_draw_filled(draws, [row("a")]) is False
    assert any_draw_filled(draws, [row("serial")]) is True


def test_rows_become_one_call_each_or_batches_up_to_the_size():
    regs = handlers(reg("a"), reg("batch", batch=2))
    rows = [row("batch", 0), row("a", 0), row("batch", 1), row("batch", 2), row("a", 1)]
    calls = split_calls(rows, regs)
    assert [(r.name, [t.id for t in tasks]) for r, tasks in calls] == [
        ("batch", ["batch-0", "batch-1"]),
        ("batch", ["batch-2"]),
        ("a", ["a-0"]),
        ("a", ["a-1"]),
    ]


def test_names_select_handlers_and_unknown_names_are_refused():
    regs = handlers(reg("a"), reg("b"))
    assert list(select_handlers(regs, None)) == ["a", "b"]
    assert list(select_handlers(regs, ("b",))) == ["b"]
    with pytest.raises(ValueError, match="No handler is registered for 'nope'; .*: a, b"):
        select_handlers(regs, ("nope",))


def test_explicit_queues_are_served_alone():
    regs = handlers(reg("a", queue="mail"))
    assert served_queues(("x", "y"), ["default"], regs, ["tasks"]) == ["x", "y"]


def test_configured_queues_gain_the_declared_and_backend_ones():
    regs = handlers(reg("a", queue="mail"), reg("b"), reg("c", queue="default"))
    assert served_queues(None, ["default"], regs, ["tasks"]) == ["default", "mail", "tasks"]
    assert served_queues(None, "solo", {}, []) == ["solo"]
    assert served_queues(None, [], {}, []) == ["default"]
