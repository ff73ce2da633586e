"""How many calls a worker runs, and how many it holds while completions are written.

A slot frees when a handler returns; its completion is written by the
settler afterwards. These tests pin both limits: never more handlers at once
than `concurrency`, and never more than `concurrency` returned calls waiting
for their completion, however slow the database is.
"""

from __future__ import annotations

import threading
import time

from django.db import connections

from cairnq_django import enqueue, get
from cairnq_django.worker import Registry, Worker
from cairnq_django.worker.settler import Settler
from tests.workerutil import wait_for


def _count_running(store) -> int:
    with connections[store.using].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_tasks WHERE status = 'running'")
        return cursor.fetchone()[0]


def _run_in_thread(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def test_no_more_handlers_run_at_once_than_concurrency(live_store):
    lock = threading.Lock()
    state = {"now": 0, "most": 0}
    gate = threading.Event()

    def handler(ctx, payload):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        gate.wait(0.05)  # long enough for the loop to try to over-claim
        with lock:
            state["now"] -= 1

    reg = Registry()
    reg.register("slots.busy", handler)
    tasks = [enqueue("slots.busy", {"i": i}) for i in range(12)]
    worker = Worker(registry=reg, concurrency=3, poll_ms=50)
    thread = _run_in_thread(worker)
    try:
        wait_for(lambda: all(get(t.id).status == "succeeded" for t in tasks), timeout=60)
    finally:
        worker.stop()
        thread.join(30)
    assert state["most"] == 3


def test_claims_stop_while_completions_back_up(live_store, monkeypatch):
    written = threading.Event()
    real = Settler._write_group

    def slow_database(self, group):
        # Outside the SQLite write gate, so only this settler waits.
        written.wait(60)
        return real(self, group)

    monkeypatch.setattr(Settler, "_write_group", slow_database)
    returned = []
    reg = Registry()
    reg.register("slots.quick", lambda ctx, payload: returned.append(ctx.task_id))
    tasks = [enqueue("slots.quick", {"i": i}) for i in range(10)]
    worker = Worker(registry=reg, concurrency=2, poll_ms=50)
    thread = _run_in_thread(worker)
    try:
        # Two handlers returned and wait to be settled; two more may run.
        wait_for(lambda: len(returned) >= 4, timeout=30)
        for _ in range(20):
            assert _count_running(live_store) <= 4
            assert len(worker._in_flight) <= 4
            time.sleep(0.02)
        written.set()
        wait_for(lambda: all(get(t.id).status == "succeeded" for t in tasks), timeout=60)
    finally:
        written.set()
        worker.stop()
        thread.join(30)
    assert sorted(returned) == sorted(t.id for t in tasks)  # each ran exactly once


def test_free_slots_are_filled_even_when_another_names_draw_comes_up_empty(live_store):
    # The batch name draws first and finds nothing; then the limited name's
    # empty draw shares a claim with the shared draw, which gets one of two
    # slots. That claim must still count as "more may be due", or the second
    # task would wait for the first to finish.
    both_running = threading.Barrier(2, timeout=20)
    reg = Registry()
    reg.register("slots.batch", lambda ctxs: None, batch=4)
    reg.register("slots.limited", lambda ctx, payload: None, concurrency=1)
    reg.register("slots.pair", lambda ctx, payload: both_running.wait())
    tasks = [enqueue("slots.pair", {"i": i}) for i in range(2)]
    # Poll and heartbeat (lease/3) far beyond the barrier's timeout: nothing
    # but the claim loop itself may start the second task.
    worker = Worker(registry=reg, concurrency=2, poll_ms=120_000, lease_ms=120_000)
    thread = _run_in_thread(worker)
    try:
        wait_for(lambda: all(get(t.id).status != "queued" for t in tasks), timeout=30)
        wait_for(lambda: all(get(t.id).is_terminal for t in tasks), timeout=30)
    finally:
        worker.stop()
        thread.join(30)
    assert [get(t.id).status for t in tasks] == ["succeeded", "succeeded"]
