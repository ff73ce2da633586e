"""The scheduler against a real database: compare-and-set, policies, pause, run now."""

from __future__ import annotations

from datetime import timedelta

import pytest

from cairnq_django import get
from cairnq_django.models import ScheduleState, Task
from cairnq_django.schedules import state
from cairnq_django.schedules.config import parse_schedule
from cairnq_django.schedules.scheduler import MAX_SLEEP_MS, Scheduler
from cairnq_django.store import get_store

pytestmark = pytest.mark.django_db


def schedules(**specs):
    return parse_schedule({name: {"task": "tests.echo", **spec} for name, spec in specs.items()})


def scheduler(**specs) -> Scheduler:
    return Scheduler(using="default", schedules=schedules(**specs))


def tasks_of(name):
    """The schedule's tasks in occurrence order (ids written in one millisecond are unordered)."""
    return sorted(
        Task.objects.filter(metadata__schedule=name),
        key=lambda task: (task.metadata.get("occurrence_ms") or 0, task.created_at_ms),
    )


def clock_ms():
    return get_store("default").clock_ms()


def set_cursor(name, cursor_ms):
    ScheduleState.objects.filter(name=name).update(cursor_ms=cursor_ms)


def test_a_new_schedule_starts_from_now_and_enqueues_nothing_yet():
    sched = scheduler(hourly={"every": timedelta(hours=1)})
    before = clock_ms()
    sleep_ms = sched.tick()
    row = ScheduleState.objects.get(name="hourly")
    assert before <= row.cursor_ms <= clock_ms()
    assert (row.last_task_id, row.last_occurrence_ms, row.paused) == (None, None, False)
    assert tasks_of("hourly") == []
    # It sleeps until the next occurrence, but re-reads the table at least every 30 s.
    assert 0 < sleep_ms <= MAX_SLEEP_MS + 10


def test_due_occurrences_are_enqueued_once_each_with_their_occurrence():
    sched = scheduler(tick={"every": 1000, "payload": {"n": 1}, "queue": "periodic",
                            "priority": 5, "max_attempts": 2, "metadata": {"team": "ops"}})
    sched.tick()
    now = clock_ms()
    set_cursor("tick", now - 2500)
    sched.tick()
    found = tasks_of("tick")
    occurrences = [t.metadata["occurrence_ms"] for t in found]
    row = ScheduleState.objects.get(name="tick")
    # Every whole second since the cursor, up to the tick's own "now": at least
    # the ones 2 s and 1 s ago, each once, in order.
    first = (now - 2500) // 1000 * 1000 + 1000
    assert occurrences == list(range(first, row.cursor_ms + 1, 1000))
    assert len(occurrences) >= 2
    task = found[-1]
    assert (task.name, task.queue, task.priority, task.max_attempts, task.payload) == (
        "tests.echo", "periodic", 5, 2, {"n": 1}
    )
    assert task.metadata == {
        "team": "ops", "schedule": "tick", "trigger": "schedule",
        "occurrence_ms": occurrences[-1],
    }
    assert row.cursor_ms == row.last_occurrence_ms == occurrences[-1]
    assert row.last_task_id == task.id
    # A second scheduler with the same (now stale) view enqueues nothing twice.
    Scheduler(using="default", schedules=sched.schedules).tick()
    again = [t.metadata["occurrence_ms"] for t in tasks_of("tick")]
    assert len(again) == len(set(again))
    assert again[: len(occurrences)] == occurrences


def test_a_lost_compare_and_set_writes_nothing():
    [schedule] = schedules(s={"every": 1000})
    state.ensure_states("default", ["s"], 10_000)
    won = state.advance("default", schedule, expected_cursor_ms=10_000, occurrence_ms=11_000,
                        new_cursor_ms=11_000)
    assert won.metadata["occurrence_ms"] == 11_000 and get(won.id).status == "queued"
    lost = state.advance("default", schedule, expected_cursor_ms=10_000, occurrence_ms=11_000,
                         new_cursor_ms=11_000)
    assert lost is None
    assert len(tasks_of("s")) == 1
    assert ScheduleState.objects.get(name="s").cursor_ms == 11_000


def test_missed_run_once_enqueues_one_task_for_a_long_outage():
    sched = scheduler(s={"every": 1000, "grace": 0})
    sched.tick()
    now = clock_ms()
    set_cursor("s", now - 3_600_000)
    sched.tick()
    [task] = tasks_of("s")
    assert now - 1000 < task.metadata["occurrence_ms"] <= clock_ms()


def test_missed_skip_enqueues_nothing_for_a_long_outage_and_moves_on():
    # No grace: 03:00 can never be "on time" whenever the test runs.
    sched = scheduler(s={"cron": "0 3 * * *", "timezone": "UTC", "missed": "skip", "grace": 0})
    sched.tick()
    now = clock_ms()
    set_cursor("s", now - 5 * 86_400_000)
    sched.tick()
    assert tasks_of("s") == []
    row = ScheduleState.objects.get(name="s")
    assert now - 86_400_000 < row.cursor_ms <= now
    assert row.cursor_ms % 86_400_000 == 3 * 3_600_000


def test_a_paused_schedule_enqueues_nothing_and_resumes_from_now():
    sched = scheduler(s={"every": 1000})
    sched.tick()
    assert state.set_paused("default", "s", True) is True
    assert state.set_paused("default", "s", True) is False  # already paused
    set_cursor("s", clock_ms() - 5000)
    sched.tick()
    assert tasks_of("s") == []
    before = clock_ms()
    assert state.set_paused("default", "s", False) is True
    row = ScheduleState.objects.get(name="s")
    assert not row.paused and row.cursor_ms >= before
    # The occurrences that fell while it was paused are not run on resume.
    sched.tick()
    assert all(t.metadata["occurrence_ms"] > row.cursor_ms for t in tasks_of("s"))


def test_run_now_enqueues_outside_the_timetable():
    [schedule] = schedules(s={"cron": "0 3 * * *", "payload": {"kind": "daily"}})
    task = state.run_now("default", schedule)
    row = ScheduleState.objects.get(name="s")
    assert row.last_task_id == task.id and row.last_occurrence_ms is None
    assert task.payload == {"kind": "daily"}
    assert task.metadata == {"schedule": "s", "trigger": "manual"}
    cursor = row.cursor_ms
    state.run_now("default", schedule)
    assert ScheduleState.objects.get(name="s").cursor_ms == cursor
    assert len(tasks_of("s")) == 2


def test_a_keyed_schedule_does_not_overlap_a_live_run():
    [schedule] = schedules(s={"every": 1000, "key": "report"})
    state.ensure_states("default", ["s"], 10_000)
    first = state.advance("default", schedule, expected_cursor_ms=10_000,
                          occurrence_ms=11_000, new_cursor_ms=11_000)
    second = state.advance("default", schedule, expected_cursor_ms=11_000,
                           occurrence_ms=12_000, new_cursor_ms=12_000)
    # The key's task is still queued: "reuse" returns it instead of a second one.
    assert second.id == first.id
    assert len(tasks_of("s")) == 1
    assert ScheduleState.objects.get(name="s").cursor_ms == 12_000


def test_a_schedule_removed_from_settings_stops():
    scheduler(a={"every": 1000}, b={"every": 1000}).tick()
    sched = scheduler(a={"every": 1000})
    now = clock_ms()
    set_cursor("a", now - 1500)
    set_cursor("b", now - 1500)
    sched.tick()
    assert tasks_of("a") and not tasks_of("b")
    assert ScheduleState.objects.get(name="b").cursor_ms == now - 1500


def test_a_renamed_schedule_starts_fresh():
    scheduler(old={"every": 1000}).tick()
    set_cursor("old", clock_ms() - 60_000)
    before = clock_ms()
    scheduler(new={"every": 1000}).tick()
    assert tasks_of("new") == []  # nothing inherited from "old"
    assert ScheduleState.objects.get(name="new").cursor_ms >= before


def test_the_worker_flag_turns_the_scheduler_off():
    from cairnq_django.management.commands.cairnq_worker import Command
    from cairnq_django.worker import Worker

    parser = Command().create_parser("manage.py", "cairnq_worker")
    assert parser.parse_args([]).scheduler is True
    assert parser.parse_args(["--no-scheduler"]).scheduler is False
    assert Worker(scheduler=False).run_scheduler is False
    assert Worker().run_scheduler is True
    assert Worker(burst=True).run_scheduler is False


def test_time_comes_from_the_queue_database_clock(monkeypatch):
    # A host clock a day behind: PostgreSQL ignores it, SQLite (one host) uses it.
    from cairnq_django.store import executor, get_store

    monkeypatch.setattr(executor, "now_ms", lambda: 86_400_000)
    scheduler(s={"every": 1000}).tick()
    cursor = ScheduleState.objects.get(name="s").cursor_ms
    if get_store("default").dialect.uses_process_clock:
        assert cursor == 86_400_000
    else:
        assert cursor > 1_700_000_000_000


def test_a_schedule_takes_its_handlers_declared_options_unless_it_sets_its_own():
    """Issue 32: a schedule enqueues by name, so the handler's @task options hold there too."""
    from cairnq_django import task
    from cairnq_django.worker.registry import registry

    task("tests.declared_for_schedule", queue="reports", max_attempts=5, priority=7)(
        lambda ctx, payload: None
    )
    try:
        declared, own = (
            parse_schedule({name: {"task": "tests.declared_for_schedule", "every": 60_000, **spec}})[0]
            for name, spec in (("declared", {}), ("own", {"queue": "mine", "max_attempts": 1}))
        )
        first, second = state.run_now("default", declared), state.run_now("default", own)
    finally:
        registry.unregister("tests.declared_for_schedule")
    assert (first.queue, first.max_attempts, first.priority) == ("reports", 5, 7)
    assert (second.queue, second.max_attempts, second.priority) == ("mine", 1, 7)
