"""Retention: configuration checks, what a sweep deletes, batching, dry runs and stopping."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from cairnq_django.ids import now_ms
from cairnq_django.retention import (
    RetentionRule,
    RetentionSweeper,
    format_compact_duration,
    parse_duration,
    parse_retention,
    retention_config_errors,
    rules_for_overrides,
)

from .storeutil import make_ids

HOUR = 3_600_000
DAY = 24 * HOUR


def age_live_rows(store, ids, age_ms):
    """Give live rows a completed_at_ms far in the past (a state the protocol never writes)."""
    marks = ", ".join(["%s"] * len(ids))
    with connections[store.using].cursor() as cursor:
        cursor.execute(
            f"UPDATE cairnq_tasks SET completed_at_ms = %s WHERE id IN ({marks})",
            [now_ms() - age_ms, *ids],
        )


def remaining(store):
    with connections[store.using].cursor() as cursor:
        cursor.execute("SELECT id FROM cairnq_tasks")
        return {row[0] for row in cursor.fetchall()}


# ------------------------------------------------------------ configuration
INVALID = [
    pytest.param(-1, "is negative (-1)", "timedelta(days=7)", id="negative-ms"),
    pytest.param(timedelta(hours=-1), "is negative", "number of milliseconds", id="negative-td"),
    pytest.param("7d", "is the string '7d'", "only by the cairnq_sweep command", id="string"),
    pytest.param(True, "must be None, a cutoff, a dict or a list, not bool", "Use None", id="bool"),
    pytest.param(float("inf"), "not a finite duration", "timedelta", id="infinite"),
    pytest.param(
        {}, "is an empty dict, which sweeps nothing", "set RETENTION to None", id="empty-map"
    ),
    pytest.param(
        [], "is an empty list, which sweeps nothing", "Give at least one rule", id="empty-list"
    ),
    pytest.param(
        {"queued": HOUR}, "has a key 'queued', which is not a finished status",
        "'succeeded', 'failed' or 'canceled'", id="live-status",
    ),
    pytest.param(
        {"success": HOUR}, "has a key 'success', which is not a task status",
        "'succeeded', 'failed' or 'canceled'", id="unknown-status",
    ),
    pytest.param(
        {"failed": -5}, "['failed'] is negative (-5)", "zero or more", id="negative-in-map",
    ),
    pytest.param(
        {"failed": "30d"}, "['failed'] is the string '30d'", "timedelta", id="string-in-map",
    ),
    pytest.param(
        {"queue": "rpc", "older_than": HOUR}, "is a single rule dict; rules go in a list",
        "Wrap the rule in a list", id="bare-rule",
    ),
    pytest.param(
        [{"queue": "rpc"}], "[0] has no 'older_than'", "required 'older_than'", id="no-cutoff",
    ),
    pytest.param(
        [{"older_than": HOUR, "statuses": ["failed"]}], "[0] has an unknown key 'statuses'",
        "optional 'queue', 'status' and 'name'", id="unknown-key",
    ),
    pytest.param(
        [{"older_than": HOUR, "status": "running"}],
        "[0]['status'] is 'running', which is not a finished status",
        "queued and running tasks are never swept", id="rule-live-status",
    ),
    pytest.param(
        [{"older_than": HOUR, "queue": ""}], "[0]['queue'] must be a non-empty string",
        "leave 'queue' out", id="empty-queue",
    ),
    pytest.param(
        [{"older_than": HOUR, "name": 5}], "[0]['name'] must be a non-empty string",
        "leave 'name' out", id="name-type",
    ),
    pytest.param(
        [{"older_than": None}], "[0]['older_than'] must be a timedelta or a number",
        "timedelta(days=7)", id="null-cutoff",
    ),
    pytest.param(["succeeded"], "[0] must be a dict, not str", "A rule is a dict", id="rule-type"),
]

VALID = [
    pytest.param(None, [], id="off"),
    pytest.param(0, [RetentionRule(older_than_ms=0)], id="zero"),
    pytest.param(timedelta(days=7), [RetentionRule(older_than_ms=7 * DAY)], id="timedelta"),
    pytest.param(
        {"succeeded": timedelta(hours=1), "failed": 30 * DAY},
        [
            RetentionRule(older_than_ms=HOUR, status="succeeded"),
            RetentionRule(older_than_ms=30 * DAY, status="failed"),
        ],
        id="per-status",
    ),
    pytest.param(
        [
            {"queue": "rpc", "older_than": 300_000},
            {"status": "failed", "name": "emails.send", "older_than": timedelta(days=90)},
        ],
        [
            RetentionRule(older_than_ms=300_000, queue="rpc"),
            RetentionRule(older_than_ms=90 * DAY, status="failed", name="emails.send"),
        ],
        id="rules",
    ),
]


@pytest.mark.parametrize("value, message, hint", INVALID)
def test_invalid_configuration_is_reported_with_a_hint(value, message, hint):
    errors = retention_config_errors(value)
    assert len(errors) == 1, errors
    assert message in errors[0][0]
    assert errors[0][0].startswith("settings.CAIRNQ['RETENTION']")
    assert hint in errors[0][1]


# From Django 6.0 `check` also runs the database checks, so it opens a connection.
@pytest.mark.django_db
@pytest.mark.parametrize("value, message, hint", INVALID)
def test_invalid_configuration_fails_manage_py_check(value, message, hint):
    with override_settings(CAIRNQ={"RETENTION": value}):
        with pytest.raises(SystemCheckError) as caught:
            call_command("check")
    output = str(caught.value)
    assert "(cairnq.E020) settings.CAIRNQ['RETENTION']" in output
    assert message in output
    assert "HINT: " in output and hint in output


def test_every_problem_is_reported_not_just_the_first():
    errors = retention_config_errors(
        [{"older_than": -1, "status": "queued"}, {"queue": "a", "bogus": 1}]
    )
    messages = [message for message, _ in errors]
    assert messages == [
        "settings.CAIRNQ['RETENTION'][0]['older_than'] is negative (-1); "
        "a cutoff cannot be in the future.",
        "settings.CAIRNQ['RETENTION'][0]['status'] is 'queued', which is not a finished status.",
        "settings.CAIRNQ['RETENTION'][1] has an unknown key 'bogus'.",
        "settings.CAIRNQ['RETENTION'][1] has no 'older_than'.",
    ]


# From Django 6.0 `check` also runs the database checks, so it opens a connection.
@pytest.mark.django_db
@pytest.mark.parametrize("value, rules", VALID)
def test_valid_configuration_passes_check_and_parses(value, rules):
    assert retention_config_errors(value) == []
    with override_settings(CAIRNQ={"RETENTION": value}):
        call_command("check")
        assert RetentionSweeper.from_settings().rules == rules
    assert parse_retention(value) == rules


def test_invalid_settings_refuse_to_build_a_sweeper():
    with override_settings(CAIRNQ={"RETENTION": {"queued": HOUR}}):
        with pytest.raises(ImproperlyConfigured, match="which is not a finished status"):
            RetentionSweeper.from_settings()


def test_invalid_arguments_refuse_to_build_a_sweeper():
    with pytest.raises(ValueError, match=r"rules is an empty list"):
        RetentionSweeper(rules=[])
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1, got 0"):
        RetentionSweeper(rules=HOUR, batch_size=0)
    with pytest.raises(ValueError, match=r"pause_ms must be an integer >= 0, got -1"):
        RetentionSweeper(rules=HOUR, pause_ms=-1)


def test_settings_supply_the_sweep_knobs():
    with override_settings(
        CAIRNQ={"RETENTION": HOUR, "SWEEP_BATCH_SIZE": 7, "SWEEP_PAUSE": timedelta(seconds=2),
                "SWEEP_INTERVAL": 90_000}
    ):
        sweeper = RetentionSweeper.from_settings()
    assert (sweeper.batch_size, sweeper.pause_ms, sweeper.interval_ms) == (7, 2000, 90_000)
    assert RetentionSweeper(rules=HOUR, batch_size=3).batch_size == 3


def test_rules_describe_themselves():
    rule = RetentionRule(older_than_ms=DAY + 12 * HOUR, status="failed", queue="q", name="n")
    assert rule.describe() == "failed tasks in queue 'q' named 'n' older than 1d12h"
    assert RetentionRule(older_than_ms=0).describe() == "finished tasks older than 0s"


def test_overrides_narrow_configured_rules_without_widening_them():
    configured = [
        RetentionRule(older_than_ms=HOUR, status="succeeded"),
        RetentionRule(older_than_ms=DAY, queue="rpc"),
    ]
    assert rules_for_overrides(configured, queues=["rpc"]) == [
        RetentionRule(older_than_ms=HOUR, status="succeeded", queue="rpc"),
        RetentionRule(older_than_ms=DAY, queue="rpc"),
    ]
    assert rules_for_overrides(configured, statuses=["failed"], queues=["jobs"]) == []
    assert rules_for_overrides(configured, older_than_ms=5, statuses=["failed", "canceled"]) == [
        RetentionRule(older_than_ms=5, status="failed"),
        RetentionRule(older_than_ms=5, status="canceled"),
    ]


# ---------------------------------------------------------------- sweeping
def test_single_cutoff_deletes_old_finished_tasks_only(store):
    old = make_ids(store, "succeeded", age_ms=2 * HOUR) + make_ids(store, "failed", age_ms=2 * HOUR)
    old += make_ids(store, "canceled", age_ms=3 * DAY)
    young = make_ids(store, "succeeded", age_ms=10 * 60_000) + make_ids(store, "failed", age_ms=0)
    live = make_ids(store, "queued", n=2) + make_ids(store, "running", n=2)
    # Even a live row with a stale completed_at_ms (never written by the protocol) stays.
    age_live_rows(store, live, 10 * DAY)

    results = RetentionSweeper(rules=HOUR, pause_ms=0).sweep_once()

    assert remaining(store) == set(young + live)
    assert [(r.description, r.deleted, r.batches) for r in results] == [
        ("finished tasks older than 1h", 3, 1)
    ]
    assert not set(old) & remaining(store)


def test_per_status_cutoffs_and_statuses_left_out(store, settings):
    settings.CAIRNQ = {"RETENTION": {"succeeded": timedelta(hours=1), "failed": 30 * DAY}}
    succeeded_old = make_ids(store, "succeeded", age_ms=2 * HOUR, n=2)
    succeeded_young = make_ids(store, "succeeded", age_ms=30 * 60_000)
    failed_recent = make_ids(store, "failed", age_ms=2 * HOUR)
    failed_old = make_ids(store, "failed", age_ms=31 * DAY)
    canceled_ancient = make_ids(store, "canceled", age_ms=365 * DAY)  # status left out
    live = make_ids(store, "queued") + make_ids(store, "running")

    results = RetentionSweeper.from_settings(pause_ms=0).sweep_once()

    assert remaining(store) == set(succeeded_young + failed_recent + canceled_ancient + live)
    assert [(r.rule.status, r.deleted) for r in results] == [("succeeded", 2), ("failed", 1)]
    assert not set(succeeded_old + failed_old) & remaining(store)


def test_rules_filter_by_queue_status_and_name(store, settings):
    settings.CAIRNQ = {
        "RETENTION": [
            {"queue": "rpc", "older_than": 300_000},
            {"status": "failed", "name": "emails.send", "older_than": timedelta(days=7)},
        ]
    }
    rpc_old = make_ids(store, "succeeded", queue="rpc", age_ms=HOUR)
    rpc_old += make_ids(store, "failed", queue="rpc", name="emails.send", age_ms=HOUR)
    rpc_young = make_ids(store, "succeeded", queue="rpc", age_ms=60_000)
    jobs_old = make_ids(store, "succeeded", queue="jobs", age_ms=30 * DAY)
    email_failed_old = make_ids(store, "failed", queue="jobs", name="emails.send", age_ms=8 * DAY)
    email_failed_young = make_ids(store, "failed", queue="jobs", name="emails.send", age_ms=6 * DAY)
    email_ok_old = make_ids(store, "succeeded", queue="jobs", name="emails.send", age_ms=30 * DAY)
    other_failed_old = make_ids(store, "failed", queue="jobs", name="reports", age_ms=30 * DAY)
    rpc_live = make_ids(store, "queued", queue="rpc")

    results = RetentionSweeper.from_settings(pause_ms=0).sweep_once()

    assert remaining(store) == set(
        rpc_young + jobs_old + email_failed_young + email_ok_old + other_failed_old + rpc_live
    )
    assert [r.deleted for r in results] == [2, 1]
    assert not set(rpc_old + email_failed_old) & remaining(store)


def test_purging_frees_the_business_key(store):
    [task_id] = make_ids(store, "succeeded", age_ms=2 * HOUR, key="invoice-7")
    assert store.get_by_key("invoice-7").id == task_id

    RetentionSweeper(rules=HOUR, pause_ms=0).sweep_once()

    assert store.get_by_key("invoice-7") is None
    assert store.submit("job", {}, key="invoice-7").id != task_id


def test_batches_respect_the_limit_and_drain_everything(store):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=25)
    keep = make_ids(store, "succeeded", age_ms=0)
    progress = []

    sweeper = RetentionSweeper(
        rules={"succeeded": HOUR}, batch_size=10, pause_ms=0,
        on_batch=lambda rule, deleted: progress.append((rule.status, deleted)),
    )
    [result] = sweeper.sweep_once()

    assert progress == [("succeeded", 10), ("succeeded", 20), ("succeeded", 25)]
    assert (result.deleted, result.batches, result.complete) == (25, 3, True)
    assert remaining(store) == set(keep)


def test_an_exact_multiple_of_the_batch_size_drains_too(store):
    make_ids(store, "failed", age_ms=2 * HOUR, n=20)
    [result] = RetentionSweeper(rules=HOUR, batch_size=10, pause_ms=0).sweep_once()
    assert (result.deleted, result.batches) == (20, 2)
    assert remaining(store) == set()


def test_dry_run_counts_and_deletes_nothing(store):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=4)
    make_ids(store, "failed", age_ms=2 * HOUR, queue="q", n=3)
    make_ids(store, "failed", age_ms=0, n=5)
    make_ids(store, "queued", n=2)
    before = remaining(store)
    batches = []

    results = RetentionSweeper(
        rules=[
            {"status": "succeeded", "older_than": HOUR},
            {"status": "failed", "older_than": HOUR},
            {"queue": "q", "older_than": HOUR},
        ],
        dry_run=True,
        on_batch=lambda *args: batches.append(args),
    ).sweep_once()

    assert [(r.deleted, r.dry_run) for r in results] == [(4, True), (3, True), (3, True)]
    assert remaining(store) == before
    assert batches == []


def test_a_stopped_sweeper_deletes_nothing_more(store):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=3)
    sweeper = RetentionSweeper(rules=HOUR)
    assert sweeper.stop(timeout=0) is True
    [result] = sweeper.sweep_once()
    assert (result.deleted, result.complete) == (0, False)
    assert len(remaining(store)) == 3


def test_run_returns_at_once_when_retention_is_off(settings):
    settings.CAIRNQ = {"RETENTION": None}
    sweeper = RetentionSweeper.from_settings()
    assert sweeper.rules == []
    sweeper.run()  # returns instead of looping over nothing


# ----------------------------------------------------- run() in a thread
def eventually(predicate, timeout_s=60):
    """Poll until predicate() is true or the deadline passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def start(sweeper):
    thread = threading.Thread(target=sweeper.run, daemon=True)
    thread.start()
    return thread


def test_stop_interrupts_the_pause_and_ends_after_the_batch(live_store):
    make_ids(live_store, "succeeded", age_ms=2 * HOUR, n=30)
    first_batch = threading.Event()
    sweeper = RetentionSweeper(
        rules=HOUR, batch_size=5, pause_ms=600_000, interval_ms=600_000,
        on_batch=lambda rule, deleted: first_batch.set(),
    )
    thread = start(sweeper)
    assert first_batch.wait(60)

    # The sweeper is now in a ten-minute pause; stop must cut it short.
    assert sweeper.stop(timeout=60) is True
    thread.join(60)
    assert not thread.is_alive()
    assert len(remaining(live_store)) == 25


def test_stop_waits_for_the_batch_in_flight(live_store):
    make_ids(live_store, "succeeded", age_ms=2 * HOUR, n=3)
    in_batch, release = threading.Event(), threading.Event()

    def on_batch(rule, deleted):
        in_batch.set()
        release.wait(60)

    sweeper = RetentionSweeper(rules=HOUR, pause_ms=0, interval_ms=600_000, on_batch=on_batch)
    thread = start(sweeper)
    assert in_batch.wait(60)

    assert sweeper.stop(timeout=0.2) is False  # still inside the batch
    release.set()
    assert sweeper.stop(timeout=60) is True
    thread.join(60)
    assert not thread.is_alive()


def test_run_sweeps_again_every_interval_until_stopped(live_store):
    make_ids(live_store, "failed", age_ms=2 * HOUR, n=2)
    sweeps = []
    swept = threading.Condition()

    def on_sweep(results):
        with swept:
            sweeps.append(sum(r.deleted for r in results))
            swept.notify_all()

    sweeper = RetentionSweeper(rules=HOUR, pause_ms=0, interval_ms=50, on_sweep=on_sweep)
    thread = start(sweeper)
    with swept:
        assert swept.wait_for(lambda: sweeps and sweeps[0] == 2, 60)
    later = make_ids(live_store, "canceled", age_ms=3 * HOUR, n=3)
    with swept:
        assert swept.wait_for(lambda: 3 in sweeps, 60)
    assert sweeper.stop(timeout=60) is True
    thread.join(60)
    assert not set(later) & remaining(live_store)
    assert remaining(live_store) == set()


def test_stop_interrupts_the_interval_sleep(live_store):
    swept = threading.Event()
    sweeper = RetentionSweeper(
        rules=HOUR, interval_ms=3_600_000, on_sweep=lambda results: swept.set()
    )
    thread = start(sweeper)
    assert swept.wait(60)  # now sleeping for an hour
    assert sweeper.stop(timeout=60) is True
    thread.join(60)
    assert not thread.is_alive()


SURVIVED = []


def record_error(exc, context):
    SURVIVED.append((type(exc).__name__, context))


def test_a_failing_sweep_is_reported_and_the_loop_carries_on(live_store, settings):
    settings.CAIRNQ = {"ON_ERROR": "tests.test_retention.record_error"}
    SURVIVED.clear()
    make_ids(live_store, "succeeded", age_ms=2 * HOUR, n=2)
    sweeps = []
    sweeper = RetentionSweeper(
        rules=HOUR, pause_ms=0, interval_ms=50, on_sweep=lambda results: sweeps.append(results)
    )
    with connections["default"].cursor() as cursor:
        # A real failure: the table is gone while the sweeper starts.
        cursor.execute("ALTER TABLE cairnq_tasks RENAME TO cairnq_tasks_away")
    thread = start(sweeper)
    try:
        eventually(lambda: SURVIVED)
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("ALTER TABLE cairnq_tasks_away RENAME TO cairnq_tasks")
    assert SURVIVED and SURVIVED[0][1] == {"phase": "sweep", "database": "default"}
    assert eventually(lambda: any(r.deleted for results in sweeps for r in results))
    assert sweeper.stop(timeout=60) is True
    thread.join(60)
    assert remaining(live_store) == set()


# ---------------------------------------------------------------- durations
@pytest.mark.parametrize(
    "ms, text",
    [(0, "0s"), (250, "250ms"), (185_000, "3m5s"), (5_400_000, "1h30m"),
     (DAY + 12 * HOUR, "1d12h"), (90_061_001, "1d1h1m1s1ms")],
)
def test_format_compact_duration_is_what_parse_duration_reads_back(ms, text):
    assert format_compact_duration(ms) == text
    assert parse_duration(text) == ms
