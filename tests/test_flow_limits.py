"""Fleet-wide concurrency and rate limits: the API, the settings, enqueue's key, and the limited claim.

Store-level and in-process; the multi-process fleet runs are tests/test_fleet_limits.py.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

from cairnq_django import (
    Limit,
    clear_limit,
    effective_limits,
    enqueue,
    enqueue_many,
    limit_usage,
    set_limit,
)
from cairnq_django.models import FlowLimit, FlowStart
from cairnq_django.store import limited_claim
from tests.storeutil import expire_lease

pytestmark = pytest.mark.django_db


def limits_setting(*entries):
    return override_settings(CAIRNQ={"LIMITS": list(entries)})


def claim(store, limits, *, queues=("default",), limit=10, names=None, draws=None, worker="w"):
    return store.claim_limited(
        limits=limits, queues=list(queues), worker_id=worker, limit=limit, names=names, draws=draws
    )


def names_of(tasks):
    return sorted(t.name for t in tasks)


# ------------------------------------------------------------------ the API
def test_settings_limits_are_in_force_and_runtime_rows_override_them(store):
    with limits_setting(
        {"name": "reports.generate", "concurrency": 3},
        {"queue": "partner", "rate": 20, "per": timedelta(seconds=2)},
        {"key_prefix": "account:", "concurrency": 1},
    ):
        assert effective_limits() == [
            Limit("name", "reports.generate", 3, None, None, "settings"),
            Limit("queue", "partner", None, 20, 2000, "settings"),
            Limit("key_prefix", "account:", 1, None, None, "settings"),
        ]
        assert set_limit("name", "reports.generate", concurrency=5, by="ops") == Limit(
            "name", "reports.generate", 5, None, None, "runtime"
        )
        set_limit("queue", "partner", by="ops")  # lifts the settings' rate limit
        set_limit("queue", "bulk", rate=1000, per=3_600_000)
        assert effective_limits() == [
            Limit("name", "reports.generate", 5, None, None, "runtime"),
            Limit("key_prefix", "account:", 1, None, None, "settings"),
            Limit("queue", "bulk", None, 1000, 3_600_000, "runtime"),
        ]
        row = FlowLimit.objects.get(scope="name", value="reports.generate")
        assert (row.concurrency, row.changed_by) == (5, "ops")
        assert clear_limit("name", "reports.generate") is True
        assert clear_limit("name", "reports.generate") is False
        assert clear_limit("queue", "partner") is True
        assert effective_limits()[:2] == [
            Limit("name", "reports.generate", 3, None, None, "settings"),
            Limit("queue", "partner", None, 20, 2000, "settings"),
        ]


def test_set_limit_twice_updates_the_one_row(store):
    set_limit("name", "a", concurrency=1)
    set_limit("name", "a", rate=5)
    assert FlowLimit.objects.count() == 1
    assert effective_limits() == [Limit("name", "a", None, 5, 1000, "runtime")]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("bogus", "x"), {"concurrency": 1}, "scope"),
        (("name", ""), {"concurrency": 1}, "non-empty"),
        (("name", 3), {"concurrency": 1}, "non-empty"),
        (("name", "x" * 256), {"concurrency": 1}, "at most 255"),
        (("name", "a\x00b"), {"concurrency": 1}, "NUL"),
        (("name", "x"), {"concurrency": 0}, "concurrency must be a positive integer"),
        (("name", "x"), {"concurrency": True}, "concurrency must be a positive integer"),
        (("name", "x"), {"rate": 2.5}, "rate must be a positive integer"),
        (("name", "x"), {"rate": 2, "per": 0}, "per"),
        (("name", "x"), {"rate": 2, "per": timedelta(0)}, "per"),
        (("name", "x"), {"rate": 2, "per": "1s"}, "per must be a timedelta"),
        (("name", "x"), {"per": 1000}, "give a rate"),
        (("name", "x"), {"concurrency": 1, "by": 3}, "by must be a string"),
    ],
)
def test_set_limit_refuses_bad_input_and_writes_nothing(store, args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        set_limit(*args, **kwargs)
    assert not FlowLimit.objects.exists()


def test_an_invalid_settings_entry_raises_where_limits_are_read(store):
    with limits_setting({"name": "x"}), pytest.raises(ValueError, match="concurrency, a rate or both"):
        effective_limits()


# -------------------------------------------------------- enqueue's key
def test_enqueue_writes_the_concurrency_key_with_the_task(store):
    from cairnq_django.models import TaskFlow

    task = enqueue("tests.echo", {}, concurrency_key="account:42")
    plain = enqueue("tests.echo", {})
    assert TaskFlow.objects.get(task_id=task.id).concurrency_key == "account:42"
    assert not TaskFlow.objects.filter(task_id=plain.id).exists()


@pytest.mark.parametrize("key", ["", 42, "x" * 256, "a\x00b"])
def test_a_bad_concurrency_key_is_refused_before_anything_is_written(store, key):
    with pytest.raises(ValueError, match="concurrency_key"):
        enqueue("tests.echo", {}, concurrency_key=key)
    assert not store.tasks().exists()


def test_the_tasks_framework_backend_passes_the_concurrency_key(store):
    from cairnq_django import compat
    from cairnq_django.models import TaskFlow

    if not compat.AVAILABLE:
        pytest.skip("no Tasks framework installed")
    from tests.tasksapp import tasks

    result = tasks.add.using(concurrency_key="account:7").enqueue(1, 2)
    assert TaskFlow.objects.get(task_id=result.id).concurrency_key == "account:7"
    with pytest.raises(compat.InvalidTask, match="concurrency_key"):
        tasks.add.using(concurrency_key="")


# ---------------------------------------------------------------- the claim
def test_a_name_limit_caps_running_tasks_and_others_still_flow(store):
    limits = [Limit("name", "slow", 2, None, None, "settings")]
    for _ in range(5):
        store.submit("slow")
    for _ in range(3):
        store.submit("fast")
    first = claim(store, limits, limit=10)
    assert names_of(first.tasks) == ["fast"] * 3 + ["slow"] * 2
    assert first.held == 3
    assert claim(store, limits).tasks == []
    store.complete(next(t for t in first.tasks if t.name == "slow").id, "w")
    assert names_of(claim(store, limits).tasks) == ["slow"]


def test_the_claim_is_the_same_one_statement_at_a_time(store, monkeypatch):
    """Server-side binding sends no multi-statement query: lock, recovery, counts and reads go apart."""
    from cairnq_django.store import postgres_engine

    monkeypatch.setattr(postgres_engine, "is_client_binding", lambda cursor: False)
    limits = [Limit("name", "slow", 1, 2, 60_000, "settings")]
    store.submit("slow")
    for _ in range(3):
        store.submit("slow")
        store.submit("fast")
    (first,) = claim(store, limits, names=["slow"], limit=1).tasks
    expire_lease(store, first.id)  # recovered by the next claim, freeing the slot
    result = claim(store, limits)
    assert names_of(result.tasks) == ["fast"] * 3 + ["slow"]
    assert result.held == 3
    assert claim(store, limits).tasks == []  # one running, and both starts of the window used


def test_a_queue_limit_counts_every_worker_s_tasks(store):
    limits = [Limit("queue", "default", 3, None, None, "settings")]
    for _ in range(6):
        store.submit("job")
    assert len(claim(store, limits, limit=2, worker="a").tasks) == 2
    assert len(claim(store, limits, limit=5, worker="b").tasks) == 1
    assert claim(store, limits, worker="c").tasks == []


def test_a_key_prefix_limit_applies_to_each_key_apart(store):
    limits = [Limit("key_prefix", "account:", 1, None, None, "settings")]
    for account in (1, 1, 2, 2, 3):
        enqueue("job", {}, concurrency_key=f"account:{account}")
    enqueue("job", {}, concurrency_key="other:1")
    enqueue("job", {})
    tasks = claim(store, limits).tasks
    assert len(tasks) == 5  # one per account, the other key and the keyless task
    assert claim(store, limits).held == 2


def test_a_held_key_does_not_hide_the_tasks_behind_it(store):
    """More held tasks than the claim reads at once: the next read leaves the full key out."""
    limits = [Limit("key_prefix", "account:", 1, None, None, "settings")]
    ahead = {t.id for t in enqueue_many(
        [{"name": "job", "priority": 1, "concurrency_key": "account:1"} for _ in range(250)]
    )}
    behind = store.submit("job")
    tasks = claim(store, limits, limit=5).tasks
    assert len(tasks) == 2 and behind.id in {t.id for t in tasks}
    assert len(ahead & {t.id for t in tasks}) == 1


def test_an_expired_lease_frees_its_slot(store):
    limits = [Limit("name", "job", 1, None, None, "settings")]
    ids = {store.submit("job").id, store.submit("job").id}
    (first,) = claim(store, limits).tasks
    assert claim(store, limits).tasks == []
    expire_lease(store, first.id)  # its worker died
    # The same transaction requeues it and takes one task in claim order.
    (taken,) = claim(store, limits).tasks
    assert taken.id in ids
    assert store.tasks().filter(status="running").count() == 1
    assert store.tasks().filter(status="queued").count() == 1


def test_per_name_draws_are_respected(store):
    limits = [Limit("name", "a", 10, None, None, "settings")]
    for _ in range(4):
        store.submit("a")
        store.submit("b")
    tasks = claim(store, limits, draws=[(["a"], 1), (["b"], 2)]).tasks
    assert names_of(tasks) == ["a", "b", "b"]


def test_a_rate_limit_is_a_sliding_window(store):
    limits = [Limit("name", "call", None, 3, 60_000, "settings")]
    for _ in range(5):
        store.submit("call")
    first = claim(store, limits)
    assert len(first.tasks) == 3
    assert FlowStart.objects.filter(scope="name", value="call").count() == 3
    held = claim(store, limits)
    assert held.tasks == [] and held.held == 2
    assert 0 < held.retry_in_ms <= 60_000
    # The window slides: move the starts 59 s back, and they are still in it; 61 s, and they are not.
    FlowStart.objects.update(started_at_ms=store.clock_ms() - 59_000)
    assert claim(store, limits).tasks == []
    FlowStart.objects.update(started_at_ms=store.clock_ms() - 61_000)
    assert len(claim(store, limits).tasks) == 2


def test_pruning_keeps_every_window_in_force(store):
    """A claim prunes its own rate limits' rows to their period, and nothing another limit still counts."""
    limits = [
        Limit("queue", "a", 5, None, None, "settings"),
        Limit("queue", "b", None, 5, 3_600_000, "settings"),
        Limit("name", "fast", None, 100, 1000, "settings"),
    ]
    now = store.clock_ms()
    FlowStart.objects.bulk_create([
        FlowStart(scope="queue", value="b", started_at_ms=now - 60_000),  # in b's hour
        FlowStart(scope="name", value="fast", started_at_ms=now - 5_000),  # out of fast's second
        FlowStart(scope="name", value="gone", started_at_ms=now - 60_000),  # no limit: kept a day
        FlowStart(scope="name", value="gone", started_at_ms=now - 2 * 86_400_000),
    ])
    store.submit("fast", queue="a")
    limited_claim._prune_at.pop(store.using, None)  # prune on this claim
    assert len(claim(store, limits, queues=["a"]).tasks) == 1
    left = sorted(FlowStart.objects.values_list("value", "started_at_ms"))
    assert [value for value, _ in left] == ["b", "fast", "gone"]
    assert dict(left)["fast"] >= now  # the start just logged; the old one is gone


def test_a_key_prefix_rate_limit_counts_each_key(store):
    limits = [Limit("key_prefix", "acct:", None, 1, 60_000, "settings")]
    for key in ("acct:1", "acct:1", "acct:2"):
        enqueue("job", {}, concurrency_key=key)
    assert len(claim(store, limits).tasks) == 2
    assert sorted(FlowStart.objects.values_list("value", flat=True)) == ["acct:1", "acct:2"]


def test_no_limits_is_the_plain_claim_statement_for_statement(store):
    from django.test.utils import CaptureQueriesContext

    store.submit("job")
    store.claim(queues=["default"], worker_id="w", limit=1)  # compile and verify first
    store.submit("job")
    store.submit("job")
    with CaptureQueriesContext(connections["default"]) as plain:
        assert len(store.claim(queues=["default"], worker_id="w", limit=1)) == 1
    with CaptureQueriesContext(connections["default"]) as limited:
        result = store.claim_limited(limits=[], queues=["default"], worker_id="w", limit=1)
    assert len(result.tasks) == 1 and result.held == 0

    def statements(context):
        # Savepoint names and (SQLite shows bound values) clock readings differ between calls.
        return [re.sub(r'"s\d+_x\d+"|\d{10,}', "_", q["sql"]) for q in context.captured_queries]

    assert statements(limited) == statements(plain)


def test_a_claim_no_limit_concerns_is_the_plain_claim(store):
    """Limits on another queue or on names the claim does not draw: no lock, no limited path."""
    from django.test.utils import CaptureQueriesContext

    limits = [Limit("queue", "other", 1, None, None, "settings"),
              Limit("name", "slow", 1, None, None, "settings")]
    for _ in range(3):
        store.submit("fast")
    with CaptureQueriesContext(connections["default"]) as captured:
        result = claim(store, limits, names=["fast"])
    assert len(result.tasks) == 3
    # The limited path reads the flow rows (running counts, candidates' keys); the plain claim does not.
    assert not any("cairnq_django_task_flow" in q["sql"] for q in captured.captured_queries)
    # A key-prefix limit concerns every claim: any task may carry a key.
    keyed = [Limit("key_prefix", "acct:", 1, None, None, "settings")]
    for key in ("acct:1", "acct:1"):
        enqueue("fast", {}, concurrency_key=key)
    assert len(claim(store, keyed, names=["fast"]).tasks) == 1


def test_limit_usage_reports_running_starts_and_held(store):
    set_limit("name", "slow", concurrency=2)
    set_limit("key_prefix", "acct:", concurrency=1, rate=10, per=60_000)
    for _ in range(5):
        store.submit("slow")
    for key in ("acct:1", "acct:1", "acct:1", "acct:2"):
        enqueue("job", {}, concurrency_key=key)
    claim(store, effective_limits())
    by_scope = {u.limit.scope: u for u in limit_usage()}
    assert (by_scope["name"].running, by_scope["name"].held) == (2, 3)
    assert (by_scope["key_prefix"].running, by_scope["key_prefix"].keys_at_limit) == (1, 2)
    assert (by_scope["key_prefix"].starts_in_window, by_scope["key_prefix"].held) == (1, 2)


# ------------------------------------------------------- the worker's reading
def test_a_worker_reads_the_limits_again_about_once_a_second(store, monkeypatch):
    from cairnq_django.worker import limits as worker_limits

    clock = [100.0]
    monkeypatch.setattr(worker_limits.time, "monotonic", lambda: clock[0])
    cache = worker_limits.LimitsCache("default")
    assert cache.current() == []
    set_limit("name", "job", concurrency=2)
    clock[0] += 0.5
    assert cache.current() == []  # read less than REREAD_S ago
    clock[0] += worker_limits.REREAD_S
    assert cache.current() == [Limit("name", "job", 2, None, None, "runtime")]


def test_a_worker_refuses_invalid_limits_settings(store):
    from django.core.exceptions import ImproperlyConfigured

    from cairnq_django.worker.limits import LimitsCache

    with limits_setting({"queue": "q", "rate": 0}), pytest.raises(ImproperlyConfigured, match="LIMITS"):
        LimitsCache("default")


@pytest.mark.django_db(transaction=True)
def test_a_limit_change_wakes_the_queues_it_concerns(live_store):
    if connections["default"].vendor != "postgresql":
        # SQLite: the commit itself changes the data_version the wakeup watches.
        import sqlite3

        watcher = sqlite3.connect(connections["default"].settings_dict["NAME"])
        try:
            before = watcher.execute("PRAGMA data_version").fetchone()[0]
            set_limit("queue", "partner", concurrency=1)
            assert watcher.execute("PRAGMA data_version").fetchone()[0] != before
        finally:
            watcher.close()
        return
    import psycopg

    enqueue("reports", {}, queue="slow-queue")
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN cairnq_queued")
        set_limit("queue", "partner", concurrency=1)
        set_limit("name", "reports", concurrency=1)
        clear_limit("name", "reports")
        heard = [note.payload for note in listener.notifies(timeout=2, stop_after=3)]
    assert heard == ["partner", "slow-queue", "slow-queue"]


# ------------------------------------------------ claimers at the same instant
def _claim_together(store, limits, claimers: int, limit: int):
    """`claimers` threads, each on its own connection, claim at once; return what each took."""
    import threading

    barrier = threading.Barrier(claimers)
    taken: list[list] = [[] for _ in range(claimers)]
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait(10)
            taken[index] = claim(store, limits, limit=limit, worker=f"w{index}").tasks
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return taken


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_exceed_a_concurrency_limit(live_store):
    store = live_store
    limits = [
        Limit("name", "job", 3, None, None, "settings"),
        Limit("key_prefix", "acct:", 1, None, None, "settings"),
    ]
    jobs = {store.submit("job").id for _ in range(12)}
    keyed = {t.id for t in enqueue_many([{"name": "keyed", "concurrency_key": "acct:1"}] * 4)}
    done: set[str] = set()
    for _ in range(4):
        taken = [t for tasks in _claim_together(store, limits, claimers=6, limit=4) for t in tasks]
        ids = [t.id for t in taken]
        assert len(ids) == len(set(ids)), "a task was claimed twice"
        assert sum(t.name == "job" for t in taken) == 3
        assert sum(t.name == "keyed" for t in taken) == 1
        assert store.tasks().filter(status="running").count() == 4
        for task in taken:
            store.complete(task.id, task.worker_id)
        done |= set(ids)
    assert done == jobs | keyed


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_exceed_a_rate_limit(live_store):
    store = live_store
    limits = [Limit("queue", "default", None, 5, 60_000, "settings")]
    for _ in range(20):
        store.submit("job")
    taken = [t for tasks in _claim_together(store, limits, claimers=8, limit=3) for t in tasks]
    assert len(taken) == 5
    assert FlowStart.objects.filter(scope="queue", value="default").count() == 5


# ------------------------------------------------------- a worker, end to end
def _journal(path):
    """{task id: (name-free) (claimed ms, start ns, end ns)} from tests.interval's journal."""
    starts, ends = {}, {}
    with open(path) as lines:
        for line in lines:
            kind, task_id, _attempt, _worker, claimed, ns = line.split()
            (starts if kind == "S" else ends)[task_id] = (int(claimed), int(ns))
    return {task_id: (starts[task_id][0], starts[task_id][1], ends[task_id][1]) for task_id in ends}


def _most_at_once(spans):
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


@pytest.mark.django_db(transaction=True)
def test_worker_processes_honour_a_concurrency_and_a_rate_limit(live_store, child_env, tmp_path):
    from tests.workerutil import WorkerProcess

    journal = tmp_path / "journal.txt"
    env = dict(child_env, CAIRNQ_TEST_JOURNAL=str(journal))
    capped = [enqueue("tests.interval_capped", {"hold_s": 0.15}).id for _ in range(8)]
    rated = [enqueue("tests.interval", {}, queue="rated").id for _ in range(8)]
    free = [enqueue("tests.interval", {"hold_s": 0.05}).id for _ in range(6)]
    settings = {"LIMITS": [
        {"name": "tests.interval_capped", "concurrency": 2},
        {"queue": "rated", "rate": 3, "per": 500},
    ]}
    workers = [
        WorkerProcess(env, "--burst", "-q", "default", "-q", "rated", "--concurrency", "4", settings=settings)
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.wait(120) == 0, worker.output()
    finally:
        for worker in workers:
            worker.stop()
    runs = _journal(journal)
    assert set(runs) == {*capped, *rated, *free}
    assert _most_at_once([runs[t][1:] for t in capped]) <= 2
    claimed = sorted(runs[t][0] for t in rated)
    # Sliding window: any 3 consecutive starts later, the window has moved on by a whole period.
    assert all(later - earlier >= 500 for earlier, later in zip(claimed, claimed[3:], strict=False))
    assert not FlowStart.objects.filter(scope="queue", value="default").exists()
