"""The cairnq_sweep management command: output, overrides, errors, and --loop under signals."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from .storeutil import make_ids
from .test_retention import DAY, HOUR, remaining

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def sweep(*args, **options):
    out, err = io.StringIO(), io.StringIO()
    call_command("cairnq_sweep", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def per_status(settings):
    settings.CAIRNQ = {
        "RETENTION": {"succeeded": timedelta(hours=1), "failed": 30 * DAY},
        "SWEEP_PAUSE": 0,
    }


def test_one_sweep_reports_each_rule(store, per_status):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=2)
    make_ids(store, "failed", age_ms=2 * HOUR)
    kept = make_ids(store, "failed", age_ms=2 * HOUR) + make_ids(store, "canceled", age_ms=90 * DAY)

    out, err = sweep()

    assert out == (
        "Deleted 2 succeeded tasks older than 1h (1 batch).\n"
        "Deleted 0 failed tasks older than 30d (0 batches).\n"
        "Deleted 2 tasks in all.\n"
    )
    assert err == ""
    assert len(remaining(store)) == 3 and set(kept) <= remaining(store)


def test_dry_run_says_what_would_go_and_keeps_it(store, per_status):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=3)
    make_ids(store, "failed", age_ms=31 * DAY)
    before = remaining(store)

    out, _ = sweep("--dry-run")

    assert out == (
        "Would delete 3 succeeded tasks older than 1h.\n"
        "Would delete 1 failed task older than 30d.\n"
        "Would delete 4 tasks in all.\n"
    )
    assert remaining(store) == before


@pytest.mark.parametrize(
    "older_than, expected",
    [("90m", "1h30m"), ("5400000", "1h30m"), ("2h", "2h"), ("1d", "1d")],
)
def test_older_than_accepts_milliseconds_and_units(store, older_than, expected):
    old = make_ids(store, "succeeded", age_ms=3 * DAY)
    out, _ = sweep("--older-than", older_than)
    assert out == f"Deleted 1 finished task older than {expected} (1 batch).\n"
    assert not set(old) & remaining(store)


def test_one_off_filters_replace_the_settings(store, per_status):
    target = make_ids(store, "failed", queue="q", name="n", age_ms=3 * HOUR)
    kept = make_ids(store, "failed", queue="q", name="other", age_ms=3 * HOUR)
    kept += make_ids(store, "failed", queue="other", name="n", age_ms=3 * HOUR)
    kept += make_ids(store, "succeeded", queue="q", name="n", age_ms=3 * HOUR)
    kept += make_ids(store, "failed", queue="q", name="n", age_ms=HOUR)

    out, _ = sweep("--older-than", "2h", "--status", "failed", "--queue", "q", "--name", "n")

    assert out == "Deleted 1 failed task in queue 'q' named 'n' older than 2h (1 batch).\n"
    assert remaining(store) == set(kept)
    assert not set(target) & remaining(store)


def test_filters_without_a_cutoff_narrow_the_settings(store, per_status):
    make_ids(store, "succeeded", queue="q", age_ms=2 * HOUR)
    kept = make_ids(store, "succeeded", queue="other", age_ms=2 * HOUR)

    out, _ = sweep("--queue", "q", "--status", "succeeded")

    assert out == "Deleted 1 succeeded task in queue 'q' older than 1h (1 batch).\n"
    assert remaining(store) == set(kept)


def test_repeated_status_makes_a_rule_each(store):
    make_ids(store, "failed", age_ms=2 * HOUR)
    make_ids(store, "canceled", age_ms=2 * HOUR, n=2)
    kept = make_ids(store, "succeeded", age_ms=2 * HOUR)

    out, _ = sweep("--older-than", "1h", "--status", "failed", "--status", "canceled")

    assert out.splitlines() == [
        "Deleted 1 failed task older than 1h (1 batch).",
        "Deleted 2 canceled tasks older than 1h (1 batch).",
        "Deleted 3 tasks in all.",
    ]
    assert remaining(store) == set(kept)


def test_batch_size_and_progress_on_stderr(store):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=7)

    out, err = sweep("--older-than", "1h", "--batch-size", "2", "--progress")

    assert out == "Deleted 7 finished tasks older than 1h (4 batches).\n"
    # Not a terminal, so plain lines; the first shows once a second batch went.
    assert err.splitlines()[0] == "finished tasks older than 1h: 4 deleted so far"


def test_no_progress_when_stderr_is_not_a_terminal(store):
    make_ids(store, "succeeded", age_ms=2 * HOUR, n=7)
    _, err = sweep("--older-than", "1h", "--batch-size", "2")
    assert err == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--older-than", "soon"],
            "Error: argument --older-than: 'soon' is not a duration; write a number of milliseconds or a "
            "number with a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d.",
        ),
        (
            ["--older-than=-1h"],
            "Error: argument --older-than: '-1h' is not a duration; write a number of milliseconds or a "
            "number with a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d.",
        ),
        (
            ["--older-than", "1h", "--batch-size", "0"],
            "Error: argument --batch-size: expected an integer >= 1, got '0'",
        ),
        (
            ["--older-than", "1h", "--database", "nope"],
            "Error: argument --database: 'nope' is not in settings.DATABASES; use one of "
            + ", ".join(sorted(settings.DATABASES)),
        ),
        (
            [],
            "Retention is off (settings.CAIRNQ['RETENTION'] is None). Configure it, or pass "
            "--older-than (e.g. --older-than 7d) for a one-off sweep.",
        ),
    ],
)
def test_bad_input_is_a_clear_command_error(db, args, message):
    with pytest.raises(CommandError) as caught:
        sweep(*args)
    assert str(caught.value) == message


def test_a_live_status_is_refused(db):
    with pytest.raises(CommandError, match=r"argument --status: invalid choice: 'queued'"):
        sweep("--older-than", "1h", "--status", "queued")


def test_filters_no_rule_covers_are_refused(db, per_status):
    with pytest.raises(CommandError) as caught:
        sweep("--status", "canceled")
    assert str(caught.value) == (
        "No rule in settings.CAIRNQ['RETENTION'] covers the given --status/--queue/--name; "
        "nothing to sweep. Pass --older-than to sweep them anyway."
    )


def test_invalid_settings_are_a_command_error(db, settings):
    settings.CAIRNQ = {"RETENTION": {"running": HOUR}}
    with pytest.raises(CommandError, match=r"has a key 'running', which is not a finished status"):
        sweep()


# ------------------------------------------------------------ --loop, for real
def spawn_loop(child_env, *args):
    env = dict(child_env, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "django", "cairnq_sweep", "--loop", *args],
        cwd=PROJECT_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until(stream, needle, deadline_s=60):
    """Read lines until one contains needle; return everything read."""
    seen = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"{needle!r} never appeared; got {''.join(seen)!r}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_loop_sweeps_until_signalled(live_store, child_env, signum):
    make_ids(live_store, "succeeded", age_ms=2 * HOUR, n=3)
    child = spawn_loop(child_env, "--older-than", "1h")
    try:
        head = read_until(child.stdout, "Deleted")
        assert "until SIGTERM or SIGINT" in head
        assert "Deleted 3 finished tasks older than 1h (1 batch)." in head
        # It is now asleep for the settings' interval (a minute); the signal
        # must wake it and end it cleanly.
        child.send_signal(signum)
        rest, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    assert rest.strip().endswith("Stopped.")
    assert remaining(live_store) == set()


def test_progress_is_redrawn_in_place_on_a_terminal(live_store, child_env):
    import pty

    make_ids(live_store, "succeeded", age_ms=2 * HOUR, n=7)
    controller, terminal = pty.openpty()
    try:
        child = subprocess.run(
            [sys.executable, "-m", "django", "cairnq_sweep", "--older-than", "1h",
             "--batch-size", "2"],
            cwd=PROJECT_ROOT, env=child_env, stdout=subprocess.PIPE, stderr=terminal,
            text=True, timeout=120,
        )
        os.close(terminal)
        terminal = None
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal side is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if terminal is not None:
            os.close(terminal)
        os.close(controller)
    assert child.returncode == 0
    assert child.stdout == "Deleted 7 finished tasks older than 1h (4 batches).\n"
    assert b"\r\x1b[Kfinished tasks older than 1h: 4 deleted so far" in drawn
    assert drawn.endswith(b"\r\x1b[K")  # the line is wiped before the summary


def test_a_signal_ends_a_one_off_sweep_after_the_batch_in_flight(live_store, child_env):
    make_ids(live_store, "succeeded", age_ms=2 * HOUR, n=200)
    # One row per statement with the default 50 ms pause: about ten seconds of sweeping.
    child = subprocess.Popen(
        [sys.executable, "-m", "django", "cairnq_sweep", "--older-than", "1h",
         "--batch-size", "1", "--progress"],
        cwd=PROJECT_ROOT, env=dict(child_env, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        read_until(child.stderr, "deleted so far")
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    deleted = 200 - len(remaining(live_store))
    assert 0 < deleted < 200
    assert out == (
        f"Deleted {deleted} finished tasks older than 1h ({deleted} batches, stopped early).\n"
    )


def test_loop_reports_an_empty_sweep_only_when_verbose(store, per_status, monkeypatch):
    # --loop reports each sweep through on_sweep, quiet when it deleted nothing;
    # one sweep stands in for the loop, which otherwise runs until a signal.
    from cairnq_django.retention import RetentionSweeper

    monkeypatch.setattr(RetentionSweeper, "run", lambda self: self.on_sweep(self.sweep_once()))
    out, _ = sweep("--loop")
    assert "Deleted" not in out
    assert out.rstrip().endswith("Stopped.")
    out, _ = sweep("--loop", verbosity=2)
    assert "Deleted 0 tasks in all." in out
