"""Handlers the worker tests run in real worker processes."""

import asyncio
import os
import time

from django.db import connections

from cairnq_django import Snooze, TaskError, task

RUNS_TABLE = "worker_test_runs"


def record_run(ctx, note: str = "") -> None:
    """Insert one row per handler run (outside any task transaction)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {RUNS_TABLE} (task_id, worker_id, attempt, note) VALUES (%s, %s, %s, %s)",
            [ctx.task_id, ctx.worker_id, ctx.attempt, note],
        )


def runs_of(ctx) -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {RUNS_TABLE} WHERE task_id = %s", [ctx.task_id])
        return int(cursor.fetchone()[0])


@task("tests.echo")
def echo(ctx, payload):
    return {"echo": payload, "attempt": ctx.attempt}


@task("tests.record")
def record(ctx, payload):
    record_run(ctx)
    return {"pid": os.getpid()}


@task("tests.flaky")
def flaky(ctx, payload):
    if ctx.attempt < payload["succeed_on"]:
        raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@task("tests.permanent")
def permanent(ctx, payload):
    raise TaskError("bad_input", "The input is not acceptable.", details={"field": "x"})


@task("tests.unserializable")
def unserializable(ctx, payload):
    return {"value": float("nan")}


@task("tests.wait_cancel")
def wait_cancel(ctx, payload):
    ctx.progress(0.1, "started")
    deadline = time.monotonic() + payload.get("timeout", 60)
    while time.monotonic() < deadline:
        if ctx.canceled():
            return {"stopped": "canceled"}
        time.sleep(0.05)
    return {"stopped": "timeout"}


@task("tests.sleep")
def sleep(ctx, payload):
    time.sleep(payload.get("seconds", 1))
    if payload.get("record"):
        record_run(ctx, "slept")
    return {"slept": payload.get("seconds", 1)}


@task("tests.atomic_write")
def atomic_write(ctx, payload):
    if payload.get("wait_for_steal"):
        # Wait (reading only) until the test hands the task to someone else.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT worker_id FROM cairnq_tasks WHERE id = %s", [ctx.task_id])
                if cursor.fetchone()[0] != ctx.worker_id:
                    break
            time.sleep(0.05)
    with ctx.atomic() as done:
        record_run(ctx, payload.get("marker", "atomic"))
        done.result = {"marker": payload.get("marker")}


@task("tests.spawn")
def spawn(ctx, payload):
    children = [
        ctx.submit("tests.echo", {"child": i}).id for i in range(payload.get("children", 2))
    ]
    return {"children": children}


@task("tests.batch", batch=4)
def batch(ctxs):
    results = {}
    for ctx in ctxs:
        if ctx.payload.get("fail"):
            ctx.fail(TaskError("rejected", "This item was rejected."))
        else:
            results[ctx.task_id] = {"batch_size": len(ctxs), "value": ctx.payload.get("value")}
    return results


@task("tests.async_echo")
async def async_echo(ctx, payload):
    await asyncio.sleep(0.01)
    await ctx.aprogress(0.5, "halfway")
    return {"echo": payload, "async": True}


@task("tests.gil_hog")
def gil_hog(ctx, payload):
    # sum() over a range runs in C without releasing the GIL, so no other
    # thread of this process (the heartbeat included) runs until it returns.
    return {"sum": sum(range(payload["n"]))}


@task("tests.limited", concurrency=1)
def limited(ctx, payload):
    record_run(ctx, "limited-start")
    time.sleep(payload.get("seconds", 0.2))
    record_run(ctx, "limited-end")
    return None


@task("tests.connection_identity")
def connection_identity(ctx, payload):
    """Report which database session ran this task (to see connection reuse)."""
    import uuid

    # A temporary table lives exactly as long as its session, on both databases.
    with connections["default"].cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE IF NOT EXISTS cq_session (token text)")
        cursor.execute("SELECT token FROM cq_session")
        row = cursor.fetchone()
        if row is None:
            row = (uuid.uuid4().hex,)
            cursor.execute("INSERT INTO cq_session (token) VALUES (%s)", row)
    return {"session": row[0]}


@task("tests.orm_write")
def orm_write(ctx, payload):
    """Write and read through the ORM inside a transaction (tests/test_connection_pool.py)."""
    from django.contrib.auth.models import Group
    from django.db import transaction

    with transaction.atomic():
        Group.objects.create(name=f"pool-{ctx.task_id}")
        # Hold the connection a moment, as a real handler's transaction would.
        time.sleep((payload or {}).get("hold_s", 0.005))
        return {"groups": Group.objects.filter(name__startswith="pool-").count()}


@task("tests.journal")
def journal(ctx, payload):
    """Append '<task id> <attempt> <worker id>' to the file CAIRNQ_TEST_JOURNAL names.

    No database session of its own (a fleet of workers whose handler threads
    each held one would not fit in max_connections), and one O_APPEND write
    per run, which the kernel keeps whole however many processes write.
    """
    fd = os.open(os.environ["CAIRNQ_TEST_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.task_id} {ctx.attempt} {ctx.worker_id}\n".encode())
    finally:
        os.close(fd)
    return None


@task("tests.stamp")
def stamp(ctx, payload):
    """Append '<task id> <start ms>' to CAIRNQ_TEST_JOURNAL, then hold the task hold_s seconds.

    The start is the host clock when the handler began, so a test can tell
    which tasks started after a moment it noted on the same host.
    """
    line = f"{ctx.task_id} {time.time_ns() // 1_000_000}\n".encode()
    fd = os.open(os.environ["CAIRNQ_TEST_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep((payload or {}).get("hold_s", 0))
    return None
@task("tests.snooze")
def snooze(ctx, payload):
    """Snooze `times` times (by ctx.snooze or by raising Snooze, as `how` says), then succeed."""
    record_run(ctx, "snooze")
    if runs_of(ctx) <= payload["times"]:
        if payload.get("how") == "raise":
            raise Snooze(payload["delay"])
        ctx.snooze(payload["delay"])
        return {"ignored": "the snooze settled the task"}
    return {"attempt": ctx.attempt, "runs": runs_of(ctx)}


@task("tests.async_snooze")
async def async_snooze(ctx, payload):
    from asgiref.sync import sync_to_async

    await sync_to_async(record_run)(ctx, "snooze")
    if await sync_to_async(runs_of)(ctx) <= payload["times"]:
        if payload.get("how") == "raise":
            raise Snooze(payload["delay"])
        await ctx.asnooze(payload["delay"])
        return None
    return {"attempt": ctx.attempt, "async": True}


@task("tests.snooze_batch", batch=4)
def snooze_batch(ctxs):
    """Snooze each context whose payload asks, the first time it runs; complete the rest."""
    for ctx in ctxs:
        record_run(ctx, "snooze")
        if ctx.payload.get("snooze") and runs_of(ctx) == 1:
            ctx.snooze(ctx.payload["delay"])
    return {ctx.task_id: {"runs": runs_of(ctx)} for ctx in ctxs}


def _journal_line(line: str) -> None:
    fd = os.open(os.environ["CAIRNQ_TEST_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@task("tests.interval")
def interval(ctx, payload):
    """Journal 'S <id> <attempt> <worker> <claimed ms> <start ms>', hold hold_s, journal 'E ...'.

    tests/test_fleet_limits.py rebuilds from these lines how many ran at once
    (host clock) and when each was claimed (the claim's `updated_at_ms`, the
    queue's clock, which is what a rate limit counts in). One O_APPEND write
    per line and no database session of the handler's own, as tests.journal.
    """
    claimed = ctx.record.updated_at_ms
    _journal_line(f"S {ctx.task_id} {ctx.attempt} {ctx.worker_id} {claimed} {time.time_ns()}\n")
    time.sleep((payload or {}).get("hold_s", 0))
    _journal_line(f"E {ctx.task_id} {ctx.attempt} {ctx.worker_id} {claimed} {time.time_ns()}\n")
    return None


# The same handler under a second name, for a limit on one task name.
task("tests.interval_capped")(interval)


@task("tests.net_journal")
def net_journal(ctx, payload):
    """Append "start" and "end" lines with the task id and pid to a file (test_network_faults).

    Lines this short are written whole by one O_APPEND write, so the worker
    processes can share the file.
    """
    path = payload["path"]
    with open(path, "a") as out:
        out.write(f"start {ctx.task_id} {os.getpid()} {time.time():.3f} {payload['ms']}\n")
    time.sleep(payload["ms"] / 1000)
    with open(path, "a") as out:
        out.write(f"end {ctx.task_id} {os.getpid()} {time.time():.3f} {payload['ms']}\n")
    return {"pid": os.getpid()}


from . import workflow_tasks  # noqa: E402,F401 - registers the workflow tests' handlers


class CeleryFlaky(Exception):
    """The one exception tests.celery_picky retries (test_from_celery)."""


@task("tests.celery_picky", max_attempts=3, autoretry_for=(CeleryFlaky,), retry_backoff=120)
def celery_picky(ctx, payload):
    raise CeleryFlaky("again") if payload["raise"] == "flaky" else ValueError("broken")
