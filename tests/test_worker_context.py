"""TaskContext against a real store: settling, lease gating, children, ctx.atomic."""

from datetime import timedelta

import pytest

from cairnq_django import LostLease, TaskError
from cairnq_django.worker import TaskContext
from tests.storeutil import sql
from tests.workerutil import create_runs_table, runs


def claimed_context(store, name="ctx.test", **submit):
    task = store.submit(name, {"k": 1}, **submit)
    [row] = store.claim(queues=[task.queue], worker_id="w-ctx", names=[name])
    return TaskContext(store=store, task=row, worker_id="w-ctx", lease_ms=30000)


def steal(store, task_id):
    sql(store.using, "UPDATE cairnq_tasks SET worker_id = 'someone-else' WHERE id = %s", [task_id])


def test_fields_mirror_the_row(store):
    ctx = claimed_context(store, metadata={"m": 1}, correlation_id="c-9")
    assert (ctx.name, ctx.queue, ctx.attempt, ctx.payload) == ("ctx.test", "default", 1, {"k": 1})
    assert ctx.metadata == {"m": 1} and ctx.correlation_id == "c-9"
    assert ctx.root_id == ctx.task_id and not ctx.lost_lease


def test_progress_and_settling_twice_is_a_no_op(store):
    ctx = claimed_context(store)
    ctx.progress(0.4, "reading")
    row = ctx.succeed({"ok": True})
    assert row.status == "succeeded" and row.result == {"ok": True}
    assert row.message == "reading"
    assert ctx.succeed({"again": True}) is None
    assert ctx.fail("too late") is None
    assert store.get(ctx.task_id).result == {"ok": True}


def test_fail_retryable_requeues_with_backoff(store):
    ctx = claimed_context(store)
    row = ctx.fail("flaky upstream")
    assert row.status == "queued"
    assert row.error["message"] == "flaky upstream" and row.error["retryable"] is True
    # Backoff for attempt 1 with the default 1 s base: [500, 1000) ms.
    assert 500 <= row.run_at_ms - row.updated_at_ms < 1000


def test_fail_with_task_error_is_permanent(store):
    ctx = claimed_context(store)
    row = ctx.fail(TaskError("invalid", "Invalid input."))
    assert row.status == "failed" and row.error["code"] == "invalid"


def test_lost_lease_blocks_every_write(store):
    ctx = claimed_context(store)
    steal(store, ctx.task_id)
    with pytest.raises(LostLease):
        ctx.progress(0.5)
    assert ctx.lost_lease
    with pytest.raises(LostLease):
        ctx.submit("child", {})
    with pytest.raises(LostLease):
        ctx.heartbeat()
    assert store.get(ctx.task_id).progress is None


def test_replace_metadata_needs_an_unexpired_lease(store):
    from tests.storeutil import expire_lease

    ctx = claimed_context(store, metadata={"m": 1})
    assert ctx.replace_metadata({"m": 2}).metadata == {"m": 2}
    assert ctx.metadata == {"m": 1}  # the row as claimed
    expire_lease(store, ctx.task_id)
    with pytest.raises(LostLease):
        ctx.replace_metadata({"m": 3})
    assert ctx.lost_lease
    assert store.get(ctx.task_id).metadata == {"m": 2}


def test_canceled_sees_a_cancel_request(store):
    ctx = claimed_context(store)
    assert ctx.canceled() is False
    store.cancel(ctx.task_id)
    ctx._cancel_read_at = 0.0  # skip the read throttle
    assert ctx.canceled() is True
    assert ctx.succeed("done").status == "canceled"


def test_submit_links_children(store):
    ctx = claimed_context(store, correlation_id="c-1")
    child = ctx.submit("child.task", {"n": 1}, priority=3)
    assert child.parent_id == ctx.task_id and child.root_id == ctx.root_id
    assert child.correlation_id == "c-1" and child.priority == 3
    later = ctx.submit("later.task", delay=timedelta(hours=1), key="later-1")
    assert later.run_at_ms - later.created_at_ms >= 3_600_000
    assert store.get_by_key("later-1").id == later.id
    grandchild_ctx = TaskContext(
        store=store,
        task=store.claim(queues=["default"], worker_id="w-ctx", names=["child.task"])[0],
        worker_id="w-ctx", lease_ms=30000,
    )
    grandchild = grandchild_ctx.submit("grand.task")
    assert grandchild.parent_id == child.id and grandchild.root_id == ctx.task_id


def test_atomic_commits_writes_and_completion_together(store):
    create_runs_table()
    ctx = claimed_context(store)
    with ctx.atomic() as done:
        sql(
            store.using,
            "INSERT INTO worker_test_runs (task_id, worker_id, attempt, note)"
            " VALUES (%s, 'w', 1, 'in-atomic')", [ctx.task_id],
        )
        done.result = {"rows": 1}
    assert ctx.settlement.settled
    row = store.get(ctx.task_id)
    assert row.status == "succeeded" and row.result == {"rows": 1}
    assert [r[3] for r in runs()] == ["in-atomic"]
    assert ctx.succeed() is None


def test_atomic_rolls_back_writes_when_the_lease_is_gone(store):
    create_runs_table()
    ctx = claimed_context(store)
    steal(store, ctx.task_id)
    with pytest.raises(LostLease):
        with ctx.atomic():
            sql(
                store.using,
                "INSERT INTO worker_test_runs (task_id, worker_id, attempt, note)"
                " VALUES (%s, 'w', 1, 'doomed')", [ctx.task_id],
            )
    assert runs() == []
    assert ctx.lost_lease and not ctx.settlement.settled
    assert store.get(ctx.task_id).status == "running"


def test_atomic_refuses_to_start_once_the_lease_is_known_lost(store):
    ctx = claimed_context(store)
    ctx.settlement.mark_lost_lease()
    with pytest.raises(LostLease):
        with ctx.atomic():
            raise AssertionError("The block must not run.")
