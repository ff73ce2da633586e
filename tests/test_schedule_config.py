"""Schedules in settings: parsing, the system checks, occurrence planning and DST."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from cairnq_django.checks import check_schedule
from cairnq_django.schedules.config import (
    DEFAULT_GRACE_MS,
    ScheduleConfigError,
    parse_schedule,
)

PARIS = "Europe/Paris"


def ms(*parts, tz=PARIS) -> int:
    return int(datetime(*parts, tzinfo=ZoneInfo(tz)).timestamp() * 1000)


def local(value: int, tz=PARIS) -> str:
    return datetime.fromtimestamp(value / 1000, ZoneInfo(tz)).isoformat()


def one(**spec):
    return parse_schedule({"s": {"task": "tests.echo", **spec}})[0]


# ------------------------------------------------------------------ parsing
def test_the_issue_example_parses():
    nightly, feeds = parse_schedule({
        "nightly-report": {"task": "reports.build", "cron": "0 3 * * *", "timezone": PARIS,
                           "payload": {"kind": "daily"}, "queue": "reports"},
        "poll-feeds": {"task": "feeds.poll", "every": timedelta(minutes=5)},
    })
    assert (nightly.name, nightly.task, nightly.cron, nightly.timezone, nightly.queue) == (
        "nightly-report", "reports.build", "0 3 * * *", PARIS, "reports"
    )
    assert nightly.payload == {"kind": "daily"}
    # max_attempts unset: the handler's declared value, else the protocol's 3, at enqueue.
    assert (nightly.missed, nightly.grace_ms, nightly.max_attempts) == (
        "run-once", DEFAULT_GRACE_MS, None
    )
    assert feeds.every_ms == 300_000 and feeds.cron is None
    assert feeds.expression == "every 5 minutes"
    assert nightly.describe() == "At 03:00 every day (Europe/Paris)"


def test_a_cron_schedule_defaults_to_settings_time_zone():
    with override_settings(TIME_ZONE="Asia/Tokyo"):
        assert one(cron="0 3 * * *").timezone == "Asia/Tokyo"


def test_no_schedule_setting_means_no_schedules():
    assert parse_schedule(None) == []


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"every": 5000, "bogus": 1}, "settings.CAIRNQ['SCHEDULE']['s'] has unknown key(s): 'bogus'."),
        ({"every": 5000, "task": ""}, "settings.CAIRNQ['SCHEDULE']['s']['task']: task must be a "
         "non-empty string, got ''."),
        ({}, "settings.CAIRNQ['SCHEDULE']['s'] needs exactly one of 'cron' and 'every'."),
        ({"cron": "* * * * *", "every": 1000},
         "settings.CAIRNQ['SCHEDULE']['s'] needs exactly one of 'cron' and 'every'."),
        ({"cron": "61 * * * *"}, "settings.CAIRNQ['SCHEDULE']['s']['cron'] = '61 * * * *' is "
         "not a valid cron expression: Bad minute"),
        ({"cron": "* * *"}, "settings.CAIRNQ['SCHEDULE']['s']['cron'] = '* * *' is not a valid "
         "cron expression: Wrong number of fields"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "settings.CAIRNQ['SCHEDULE']['s']"
         "['timezone'] is 'Mars/Olympus', which is not a known time zone."),
        ({"every": 5000, "timezone": "UTC"}, "settings.CAIRNQ['SCHEDULE']['s'] has a 'timezone' "
         "but no 'cron'; an 'every' interval does not depend on the time zone."),
        ({"every": 999}, "settings.CAIRNQ['SCHEDULE']['s']['every'] is 999 ms; the least is "
         "1000 ms."),
        ({"every": "5m"}, "settings.CAIRNQ['SCHEDULE']['s']['every'] must be a timedelta or a "
         "number of milliseconds, not '5m'."),
        ({"every": 5000, "missed": "all"}, "settings.CAIRNQ['SCHEDULE']['s']['missed'] is 'all'."),
        ({"every": 5000, "conflict": "merge"},
         "settings.CAIRNQ['SCHEDULE']['s']['conflict']: Unknown conflict strategy 'merge'; "
         "use one of reuse, reuse-succeeded, reject, replace."),
        ({"every": 5000, "max_attempts": 0}, "settings.CAIRNQ['SCHEDULE']['s']['max_attempts']: "
         "max_attempts must be from 1 to 2147483647, got 0."),
        ({"every": 5000, "payload": {"x": float("nan")}},
         "settings.CAIRNQ['SCHEDULE']['s']['payload'] is not JSON: "),
    ],
)
def test_bad_schedules_are_refused_with_a_message(spec, message):
    with pytest.raises(ScheduleConfigError) as caught:
        parse_schedule({"s": {"task": "tests.echo", **spec}})
    assert str(caught.value).startswith(message)


def test_a_bad_setting_type_is_refused():
    with pytest.raises(ScheduleConfigError, match="must be a dict of schedule name"):
        parse_schedule([{"task": "x"}])


# ------------------------------------------------------------------ checks
def checks(schedule):
    with override_settings(CAIRNQ={"SCHEDULE": schedule}):
        return [(m.id, m.msg, m.hint) for m in check_schedule()]


def test_check_passes_good_schedules():
    assert checks({"a": {"task": "tests.echo", "every": timedelta(seconds=30)},
                   "b": {"task": "tests.record", "cron": "*/5 * * * *", "timezone": "UTC"}}) == []


def test_check_reports_every_bad_schedule_with_hints():
    found = checks({
        "cron": {"task": "tests.echo", "cron": "0 25 * * *"},
        "zone": {"task": "tests.echo", "cron": "0 3 * * *", "timezone": "Nowhere/City"},
        "keys": {"task": "tests.echo", "every": 5000, "payload_": {}},
    })
    assert [f[0] for f in found] == ["cairnq.E030"] * 3
    assert "is not a valid cron expression: Bad hour" in found[0][1]
    assert found[0][2].startswith("Five fields, minute hour day-of-month month day-of-week")
    assert found[1][2].startswith("Use an IANA name such as 'UTC' or 'Europe/Paris'")
    assert found[2][2].startswith("Known keys: task, cron, every, timezone, payload,")


def test_check_reports_a_task_name_no_handler_is_registered_for():
    [(check_id, message, hint)] = checks({"typo": {"task": "tests.ecko", "every": 5000}})
    assert check_id == "cairnq.E031"
    assert message == (
        "settings.CAIRNQ['SCHEDULE']['typo'] enqueues task 'tests.ecko', but no handler is "
        "registered under that name."
    )
    assert "tests.echo" in hint and "SILENCED_SYSTEM_CHECKS = ['cairnq.E031']" in hint


def test_check_reports_unknown_tasks_beside_bad_schedules():
    found = checks({"bad": {"task": "tests.echo", "every": 10},
                    "typo": {"task": "tests.ecko", "every": 5000}})
    assert [f[0] for f in found] == ["cairnq.E030", "cairnq.E031"]


def test_schedule_is_a_known_cairnq_key():
    from cairnq_django.checks import check_settings

    with override_settings(CAIRNQ={"SCHEDULE": {"a": {"task": "tests.echo", "every": 5000}}}):
        assert check_settings() == []


# ------------------------------------------------------------------ planning
def test_an_interval_counts_from_the_epoch():
    schedule = one(every=timedelta(minutes=5))
    assert schedule.next_after(ms(2026, 1, 1, 0, 1, tz="UTC")) == ms(2026, 1, 1, 0, 5, tz="UTC")
    assert schedule.next_after(ms(2026, 1, 1, 0, 5, tz="UTC")) == ms(2026, 1, 1, 0, 10, tz="UTC")


def test_nothing_is_due_before_the_next_occurrence():
    schedule = one(every=1000)
    plan = schedule.plan(10_000, 10_999)
    assert (plan.run, plan.advance_to, plan.missed, plan.next_ms) == ((), 10_000, False, 11_000)


def test_late_occurrences_within_the_grace_each_run():
    schedule = one(every=1000)
    plan = schedule.plan(10_000, 13_500)
    assert plan.run == (11_000, 12_000, 13_000)
    assert (plan.advance_to, plan.missed, plan.next_ms) == (13_000, False, 14_000)


def test_a_long_gap_runs_only_the_on_time_occurrences():
    schedule = one(every=1000, grace=3000)
    plan = schedule.plan(0, 3_600_000 + 500)
    assert plan.run == (3_598_000, 3_599_000, 3_600_000)
    assert plan.missed and plan.advance_to == 3_600_000


def test_missed_run_once_runs_the_latest_missed_occurrence_once():
    schedule = one(cron="0 3 * * *", timezone=PARIS)
    # Every worker was down for four nights.
    plan = schedule.plan(ms(2026, 1, 1, 12, 0), ms(2026, 1, 5, 12, 0))
    assert plan.run == (ms(2026, 1, 5, 3, 0),)
    assert plan.missed and plan.advance_to == ms(2026, 1, 5, 3, 0)
    assert plan.next_ms == ms(2026, 1, 6, 3, 0)


def test_missed_skip_runs_nothing_and_moves_on():
    schedule = one(cron="0 3 * * *", timezone=PARIS, missed="skip")
    plan = schedule.plan(ms(2026, 1, 1, 12, 0), ms(2026, 1, 5, 12, 0))
    assert plan.run == () and plan.missed
    assert plan.advance_to == ms(2026, 1, 5, 3, 0)


def test_skip_still_runs_an_occurrence_found_within_the_grace():
    schedule = one(cron="0 3 * * *", timezone=PARIS, missed="skip")
    plan = schedule.plan(ms(2026, 1, 1, 12, 0), ms(2026, 1, 2, 3, 0, 4))
    assert plan.run == (ms(2026, 1, 2, 3, 0),) and not plan.missed


def test_a_changed_expression_takes_effect_at_the_next_occurrence():
    cursor = ms(2026, 1, 1, 3, 0)  # the hourly schedule last ran at 03:00
    hourly = one(cron="0 * * * *", timezone=PARIS)
    assert hourly.next_after(cursor) == ms(2026, 1, 1, 4, 0)
    daily = one(cron="30 5 * * *", timezone=PARIS)
    assert daily.next_after(cursor) == ms(2026, 1, 1, 5, 30)


def test_next_occurrences_lists_n():
    schedule = one(cron="0 9 * * 1-5", timezone="UTC")
    found = schedule.next_occurrences(ms(2026, 12, 4, 12, 0, tz="UTC"), 3)  # a Friday
    assert [local(x, "UTC") for x in found] == [
        "2026-12-07T09:00:00+00:00", "2026-12-08T09:00:00+00:00", "2026-12-09T09:00:00+00:00",
    ]


# ------------------------------------------------------------------ DST
# Paris moves from 02:00 to 03:00 on 29 March 2026, and from 03:00 back to
# 02:00 on 25 October 2026. cronsim follows Debian's cron: a job at a fixed
# time in the skipped hour runs at the end of the gap; one in the repeated hour
# runs once; jobs with a wildcard hour run by the wall clock as it is.
def test_dst_gap_a_fixed_time_in_the_skipped_hour_runs_when_the_clocks_move_on():
    schedule = one(cron="30 2 * * *", timezone=PARIS)
    found = schedule.next_occurrences(ms(2026, 3, 28, 12, 0), 3)
    assert [local(x) for x in found] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_dst_gap_hourly_jobs_have_one_fewer_run_that_day():
    schedule = one(cron="15 * * * *", timezone=PARIS)
    found = schedule.next_occurrences(ms(2026, 3, 29, 0, 0), 4)
    assert [local(x) for x in found] == [
        "2026-03-29T00:15:00+01:00", "2026-03-29T01:15:00+01:00",
        "2026-03-29T03:15:00+02:00", "2026-03-29T04:15:00+02:00",
    ]


def test_dst_repeat_a_fixed_time_in_the_repeated_hour_runs_once():
    schedule = one(cron="30 2 * * *", timezone=PARIS)
    found = schedule.next_occurrences(ms(2026, 10, 24, 12, 0), 2)
    assert [local(x) for x in found] == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00",
    ]
    # Ninety minutes on, in the second 02:30, nothing more is due that day.
    second = ms(2026, 10, 25, 2, 30) + 3_600_000
    assert local(second) == "2026-10-25T02:30:00+01:00"
    assert schedule.plan(found[0], second + 1000).run == ()


def test_dst_repeat_hourly_jobs_run_in_both_hours():
    schedule = one(cron="15 * * * *", timezone=PARIS)
    found = schedule.next_occurrences(ms(2026, 10, 25, 1, 0), 3)
    assert [local(x) for x in found] == [
        "2026-10-25T01:15:00+02:00", "2026-10-25T02:15:00+02:00", "2026-10-25T02:15:00+01:00",
    ]


def test_dst_the_latest_missed_occurrence_agrees_with_the_forward_one():
    schedule = one(cron="30 2 * * *", timezone=PARIS)
    # Workers down across the spring gap: the run on return is the 03:00 one.
    plan = schedule.plan(ms(2026, 3, 28, 12, 0), ms(2026, 3, 29, 12, 0))
    assert [local(x) for x in plan.run] == ["2026-03-29T03:00:00+02:00"]
    plan = schedule.plan(ms(2026, 10, 24, 12, 0), ms(2026, 10, 25, 12, 0))
    assert [local(x) for x in plan.run] == ["2026-10-25T02:30:00+02:00"]


def test_a_framework_task_takes_args_and_kwargs():
    schedule = one(task="reports.tasks.build", every=60_000, args=[1], kwargs={"kind": "daily"})
    assert schedule.task == "reports.tasks.build"
    assert schedule.payload == {"args": [1], "kwargs": {"kind": "daily"}}
    assert one(every=60_000, kwargs={"a": 1}).payload == {"args": [], "kwargs": {"a": 1}}
    with pytest.raises(ScheduleConfigError, match="has both 'payload' and 'args'/'kwargs'"):
        one(every=60_000, args=[1], payload={})
    with pytest.raises(ScheduleConfigError, match="'args' must be a list and 'kwargs' a dict"):
        one(every=60_000, args="x")
