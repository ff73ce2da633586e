"""manage.py cairnq_schedule: list with --next N, run now, pause and resume."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from cairnq_django import get
from cairnq_django.models import ScheduleState

pytestmark = pytest.mark.django_db

SCHEDULE = {
    "nightly-report": {"task": "tests.echo", "cron": "0 3 * * *", "timezone": "Europe/Paris",
                       "queue": "reports", "payload": {"kind": "daily"}},
    "poll-feeds": {"task": "tests.record", "every": 300_000},
}


@pytest.fixture(autouse=True)
def schedule_settings():
    with override_settings(CAIRNQ={"SCHEDULE": SCHEDULE}):
        yield


def run(*args) -> str:
    out = StringIO()
    call_command("cairnq_schedule", *args, stdout=out, no_color=True)
    return out.getvalue()


def test_list_shows_each_schedule_with_its_next_occurrences():
    out = run("--next", "3")
    lines = out.splitlines()
    at = lines.index("nightly-report")
    assert lines[at + 1: at + 5] == [
        "  task      tests.echo on queue 'reports'",
        "  when      0 3 * * *: At 03:00 every day (Europe/Paris)",
        "  missed    run-once",
        "  last run  never",
    ]
    nexts = lines[at + 5: at + 8]
    assert nexts[0].startswith("  next      ") and all(" 03:00:00 CE" in n for n in nexts)
    assert len({n.strip() for n in nexts}) == 3
    at = lines.index("poll-feeds")
    assert lines[at + 2] == "  when      every 5 minutes"
    minute = lines[at + 5].split()[-2][3:]
    assert lines[at + 5].startswith("  next      ") and minute[-2:] == "00"
    assert int(minute[:2]) % 5 == 0


def test_list_defaults_to_one_next_occurrence():
    out = run()
    assert out.count("  next      ") == 2 and "            20" not in out


def test_run_enqueues_now_and_list_shows_it_as_the_last_run():
    out = run("run", "nightly-report")
    task_id = out.split()[2]
    assert out == f"Enqueued tests.echo {task_id} for schedule 'nightly-report'.\n"
    task = get(task_id)
    assert (task.queue, task.payload, task.metadata) == (
        "reports", {"kind": "daily"}, {"schedule": "nightly-report", "trigger": "manual"}
    )
    assert f"{task_id} (queued)" in run()


def test_pause_and_resume():
    assert run("pause", "poll-feeds") == "Paused 'poll-feeds'.\n"
    assert run("pause", "poll-feeds") == "'poll-feeds' was already paused.\n"
    assert ScheduleState.objects.get(name="poll-feeds").paused
    listing = run()
    block = listing[listing.index("poll-feeds"):]
    assert "  state     paused" in block and "  next" not in block
    assert run("resume", "poll-feeds") == "Resumed 'poll-feeds'; it carries on from now.\n"
    assert run("resume", "poll-feeds") == "'poll-feeds' was not paused.\n"


def test_a_schedule_gone_from_settings_is_listed_as_stopped():
    run("run", "poll-feeds")
    with override_settings(CAIRNQ={"SCHEDULE": {}}):
        assert "poll-feeds\n  not in settings.CAIRNQ['SCHEDULE'] any more: stopped" in run()


def test_unknown_schedule_and_missing_name_are_errors():
    with pytest.raises(CommandError, match=r"No schedule named 'nope' in settings.CAIRNQ\['SCHEDULE'\] "
                       r"\(known: nightly-report, poll-feeds\)."):
        run("run", "nope")
    with pytest.raises(CommandError, match="run needs the name of a schedule."):
        run("run")


def test_no_schedules():
    with override_settings(CAIRNQ={}):
        assert run() == "No schedules: settings.CAIRNQ['SCHEDULE'] is empty.\n"
