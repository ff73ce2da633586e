"""cairnq_worker --reload: a changed task module is picked up; SIGTERM/SIGINT stop it cleanly."""

import importlib
import os
import signal
import sys

import pytest

import cairnq_django
from cairnq_django import compat
from tests.workerutil import WorkerProcess, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed"),
]

PROBE = """
from cairnq_django.compat import task

@task
def probe():
    return {version}
"""


def _write_probe(path, version, mtime):
    path.write_text(PROBE.format(version=version))
    os.utime(path, (mtime, mtime))  # a new mtime even within the same second


def _result(task_id):
    row = cairnq_django.get(task_id)
    return row.result if row is not None and row.status == "succeeded" else None


def test_reload_runs_the_changed_code(live_store, child_env, tmp_path):
    probe_file = tmp_path / "reload_probe.py"
    _write_probe(probe_file, 1, 1_000_000_000)
    sys.path.insert(0, str(tmp_path))
    try:
        probe = importlib.import_module("reload_probe").probe
    finally:
        sys.path.remove(str(tmp_path))
    env = {
        **child_env,
        "DJANGO_SETTINGS_MODULE": "tests.settings_reload",
        "CAIRNQ_RELOAD_DIR": str(tmp_path),
    }
    worker = WorkerProcess(env, "--reload", "-v", "2", "--poll", "100")
    try:
        first = probe.enqueue()
        assert wait_for(lambda: _result(first.id), timeout=60) == 1, worker.output()

        # The autoreloader compares each file's mtime with its previous look;
        # a change made before its first look at the module goes unseen, so
        # the change is repeated (newer each time) until it is noticed.
        mtimes = iter(range(1_000_000_100, 1_000_100_000, 100))

        def reloading():
            if "stopping the worker to reload" in worker.output():
                return True
            _write_probe(probe_file, 2, next(mtimes))
            return False

        wait_for(reloading, timeout=60, interval=0.5, message="the worker did not reload")
        # The second worker's start line: the first process has exited.
        wait_for(lambda: worker.output().count(" starting on ") >= 2, timeout=60)
        second = probe.enqueue()
        assert wait_for(lambda: _result(second.id), timeout=60) == 2, worker.output()

        worker.signal(signal.SIGTERM)
        assert worker.wait(60) == 0, worker.output()
    finally:
        sys.modules.pop("reload_probe", None)
        worker.stop()


def test_reload_and_burst_do_not_combine():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--reload and --burst cannot be combined."):
        call_command("cairnq_worker", "--reload", "--burst")


def _started_reloading_worker(child_env, **kwargs):
    worker = WorkerProcess(child_env, "--reload", "-v", "2", "--poll", "100", **kwargs)
    wait_for(lambda: " starting on " in worker.output(), timeout=60,
             message="the reloading worker did not start")
    return worker


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_supervisor_passes_a_signal_on_to_the_worker(live_store, child_env, signum):
    # The PID the command started as is the supervisor's; stopping it by
    # that PID (as a process manager or `kill` would) must stop the worker.
    worker = _started_reloading_worker(child_env)
    try:
        assert f"Supervising the reloading worker as pid {worker.pid}" in worker.output()
        worker.signal(signum)
        assert worker.wait(60) == 0, worker.output()
        out = worker.output()
        name = signal.Signals(signum).name
        assert f"Received {name}; no new tasks will be claimed." in out, out
        assert "again; exiting now" not in out, out
        assert " stopped after starting " in out, out
    finally:
        worker.stop()


def test_ctrl_c_reaches_the_worker_once(live_store, child_env):
    # A terminal's Ctrl-C signals its whole foreground process group; the
    # worker must see one SIGINT (a graceful stop), not two (exit at once).
    worker = _started_reloading_worker(child_env, new_session=True)
    try:
        os.killpg(worker.pid, signal.SIGINT)
        assert worker.wait(60) == 0, worker.output()
        out = worker.output()
        assert out.count("Received SIGINT") == 1, out
        assert " stopped after starting " in out, out
    finally:
        worker.stop()


def test_noreload_is_accepted_as_runserver_spells_it():
    from django.core.management import load_command_class

    command = load_command_class("cairnq_django", "cairnq_worker")
    parser = command.create_parser("manage.py", "cairnq_worker")
    assert parser.parse_args(["--noreload"]).reload is False
    assert parser.parse_args(["--no-reload"]).reload is False
    assert parser.parse_args([]).reload is None
