"""The shared CairnQ conformance scenarios, and the runner's ability to fail them."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import connections

from cairnq_django.conformance import (
    ConformanceError,
    load_scenario,
    load_scenarios,
    run_scenario,
    scenario_files,
)
from tests.scenario_folder import REPO_ROOT, scenario_dir, skip_or_fail_without_scenarios


def _scenario_params():
    try:
        files = scenario_files(scenario_dir())
    except ConformanceError as exc:
        # One placeholder case, so a missing folder shows up as a skip (or, under
        # CAIRNQ_REQUIRE_CONFORMANCE=1, a failure) rather than as zero collected tests.
        return [pytest.param(None, str(exc), id="scenario-folder-missing")]
    return [pytest.param(path, None, id=path.stem) for path in files]


@pytest.mark.parametrize(("path", "problem"), _scenario_params())
def test_scenario(store, path, problem):
    if path is None:
        skip_or_fail_without_scenarios()
    result = run_scenario(store, load_scenario(path))
    assert result.passed, str(result)


def _mutate(assertions):
    """Return assertions with one expectation made wrong."""
    wrong = dict(assertions)
    if "length" in wrong:
        wrong["length"] += 1
    elif "equals" in wrong:
        name = next(iter(wrong["equals"]))
        wrong["equals"] = {**wrong["equals"], name: "__mutated__"}
    elif "equalsRef" in wrong:
        wrong["equalsRef"] = "__mutated__"
    elif "notEqualsRef" in wrong:
        wrong["equalsRef"] = wrong.pop("notEqualsRef")
    elif "greaterThanRef" in wrong:
        wrong["greaterThanRef"] = 10**18
    elif "isNull" in wrong:
        wrong["notNull"] = wrong.pop("isNull")
    else:
        wrong["isNull"] = wrong.pop("notNull")
    return wrong


@pytest.mark.parametrize(("path", "problem"), _scenario_params())
def test_scenario_with_a_wrong_last_expectation_fails(store, path, problem):
    """Every shared scenario is really checked: spoiling its last assertion fails it."""
    if path is None:
        skip_or_fail_without_scenarios()
    data = load_scenario(path)
    steps = data["steps"]
    index = max(
        i for i, step in enumerate(steps)
        if "expect" in step or step["op"] == "expect" or "expectError" in step
    )
    step = dict(steps[index])
    if "expectError" in step:
        step["expectError"] = "NotTheRightError"
    elif step["op"] == "expect":
        assertions = {k: v for k, v in step.items() if k not in ("op", "target")}
        step = {"op": "expect", "target": step["target"], **_mutate(assertions)}
    else:
        step["expect"] = _mutate(step["expect"])
    result = run_scenario(store, {**data, "steps": [*steps[:index], step, *steps[index + 1:]]})
    assert not result.passed
    assert result.step == index + 1, str(result)


# ------------------------------------------------------------- self-tests
def scenario(*steps):
    return {"name": "inline", "description": "written by the test", "steps": list(steps)}


SUBMIT = {"op": "submit", "args": {"name": "job", "payload": {"n": 1}}, "save": "t"}
CLAIM = {"op": "claim", "args": {"queues": ["default"], "worker_id": "w1", "lease_ms": 5000},
         "save": "c"}
SUCCEED = {"op": "succeed", "args": {"id": "$t.id", "worker_id": "w1", "result": {"ok": True}}}


def test_correct_inline_scenario_passes(store):
    result = run_scenario(store, scenario(
        SUBMIT, CLAIM, SUCCEED,
        {"op": "get", "args": {"id": "$t.id"}, "save": "g",
         "expect": {"equals": {"status": "succeeded", "result": {"ok": True}},
                    "notNull": ["completed_at_ms"], "isNull": ["lease_until_ms"]}},
        {"op": "expect", "target": "$c.0.id", "equalsRef": "$t.id"},
        {"op": "expect", "target": "$c.0.lease_until_ms", "greaterThanRef": "$t.created_at_ms"},
    ))
    assert result.passed, str(result)
    assert str(result) == "PASS inline"


def test_wrong_status_expectation_fails(store):
    result = run_scenario(store, scenario(
        SUBMIT, CLAIM, SUCCEED,
        {"op": "get", "args": {"id": "$t.id"}, "expect": {"equals": {"status": "failed"}}},
    ))
    assert not result.passed
    assert result.step == 4
    assert 'Expected status = "failed", got "succeeded"' in result.message
    assert str(result).startswith("FAIL inline (step 4): get: ")


def test_wrong_expected_error_class_fails(store):
    result = run_scenario(store, scenario(
        {"op": "submit", "args": {"name": "x", "key": "A", "conflict": "reject"}},
        {"op": "submit", "args": {"name": "x", "key": "A", "conflict": "reject"},
         "expectError": "LostLease"},
    ))
    assert not result.passed
    assert result.step == 2
    assert "raised AlreadyExists" in result.message
    assert "expected LostLease" in result.message


def test_expected_error_that_never_comes_fails(store):
    result = run_scenario(store, scenario(
        {"op": "submit", "args": {"name": "x", "key": "A", "conflict": "reject"},
         "expectError": "AlreadyExists"},
    ))
    assert not result.passed
    assert "was expected to raise AlreadyExists" in result.message


def test_expected_error_is_saved_with_task_id_and_type(store):
    result = run_scenario(store, scenario(
        SUBMIT, CLAIM,
        {"op": "complete", "args": {"id": "$t.id", "worker_id": "intruder"},
         "expectError": "LostLease", "save": "e"},
        {"op": "expect", "target": "$e", "equals": {"type": "LostLease"}},
        {"op": "expect", "target": "$e.task_id", "equalsRef": "$t.id"},
    ))
    assert result.passed, str(result)


def test_unexpected_error_fails(store):
    result = run_scenario(store, scenario(
        SUBMIT, {"op": "complete", "args": {"id": "$t.id", "worker_id": "w1"}},
    ))
    assert not result.passed
    assert "complete raised LostLease" in result.message


@pytest.mark.parametrize("reference", ["$nosuch.id", "$t.0", "$t.no_such_field", "$ bad"])
def test_bad_reference_fails(store, reference):
    result = run_scenario(store, scenario(
        SUBMIT, {"op": "get", "args": {"id": reference}},
    ))
    assert not result.passed
    assert result.step == 2


def test_bad_reference_in_expectation_fails(store):
    result = run_scenario(store, scenario(
        SUBMIT, {"op": "expect", "target": "$t.id", "equalsRef": "$missing.id"},
    ))
    assert not result.passed
    assert "names 'missing', which no earlier step saved" in result.message


def test_isnull_on_a_misspelt_record_field_fails(store):
    result = run_scenario(store, scenario(
        SUBMIT, {"op": "expect", "target": "$t", "isNull": ["lease_untl_ms"]},
    ))
    assert not result.passed
    assert "TaskRecord has no field 'lease_untl_ms'" in result.message


@pytest.mark.parametrize(
    "step",
    [
        {"op": "teleport", "args": {}},
        {"op": "submit", "args": {"name": "job", "colour": "red"}},
        {"op": "submit", "args": {"payload": {}}},
        {"op": "submit", "args": {"name": "job"}, "expct": {"length": 1}},
        {"op": "submit", "args": {"name": "job"}, "expect": {"lenght": 1}},
        {"op": "expect", "target": "$t"},
    ],
    ids=["unknown-op", "unknown-arg", "missing-arg", "unknown-step-key",
         "unknown-assertion", "expect-without-assertion"],
)
def test_malformed_step_fails(store, step):
    result = run_scenario(store, scenario(SUBMIT, step))
    assert not result.passed
    assert result.step == 2


@pytest.mark.parametrize(
    ("assertion", "passes"),
    [
        ({"equals": {"attempt": 1}}, True),
        ({"equals": {"attempt": 1.0}}, True),
        ({"equals": {"attempt": True}}, False),
        ({"equals": {"payload": {"n": 1}}}, True),
        ({"equals": {"payload": {"n": 1, "m": 2}}}, False),
        ({"equals": {"payload": {}}}, False),
        ({"length": 2}, False),
        ({"notNull": ["completed_at_ms"]}, False),
        ({"isNull": ["worker_id"]}, False),
    ],
)
def test_assertions_compare_strictly(store, assertion, passes):
    result = run_scenario(store, scenario(
        SUBMIT, CLAIM, {"op": "expect", "target": "$c.0", **assertion},
    ))
    assert result.passed is passes, str(result)


def test_length_on_a_claim_can_fail(store):
    result = run_scenario(store, scenario(SUBMIT, {**CLAIM, "expect": {"length": 2}}))
    assert not result.passed
    assert "Expected length 2, got 1" in result.message


def test_heartbeat_batch_rows_follow_the_asked_order(store):
    result = run_scenario(store, scenario(
        {"op": "submit", "args": {"name": "job"}, "save": "a"},
        {"op": "submit", "args": {"name": "job"}, "save": "b"},
        {"op": "claim", "args": {"queues": ["default"], "worker_id": "w1", "limit": 2}},
        {"op": "heartbeat_batch", "args": {"ids": ["$b.id", "$a.id"], "worker_id": "w1",
                                           "lease_ms": 5000}, "save": "h",
         "expect": {"length": 2}},
        {"op": "expect", "target": "$h.0.id", "equalsRef": "$b.id"},
        {"op": "expect", "target": "$h.1", "equals": {"cancel_requested": False}},
    ))
    assert result.passed, str(result)


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(ConformanceError, match="does not exist"):
        load_scenarios(tmp_path / "nowhere")
    with pytest.raises(ConformanceError, match="holds no"):
        load_scenarios(tmp_path)


def test_malformed_file_is_an_error(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConformanceError, match="cannot be read as JSON"):
        load_scenarios(tmp_path)


# ------------------------------------------------------------------ CLI
def _cli_env(tmp_path):
    env = dict(os.environ)
    env.pop("CAIRNQ_CHILD_DB_NAME", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    # A test database name of its own, so the CLI's create/destroy cannot
    # clash with this session's test database or another run's.
    unique = uuid.uuid4().hex[:8]
    env["CAIRNQ_SQLITE_TEST_FILE"] = str(tmp_path / f"cli_{unique}.sqlite3")
    pg_name = connections["default"].settings_dict["NAME"]
    env["CAIRNQ_PG_TEST_NAME"] = f"{pg_name}_cli_{unique}"
    return env


def _run_cli(env, directory, *options, settings_flag=True):
    command = [sys.executable, "-m", "cairnq_django.conformance", str(directory), *options]
    if settings_flag:
        command += ["--settings", "tests.settings"]
    else:
        env = {**env, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_runs_the_shared_scenarios_on_a_fresh_database(db, tmp_path):
    directory = scenario_dir()
    if not directory.is_dir():
        skip_or_fail_without_scenarios()
    env = _cli_env(tmp_path)
    proc = _run_cli(env, directory)
    count = len(scenario_files(directory))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("PASS ") for line in lines) == count
    assert lines[-1] == f"{count} passed, 0 failed"
    # The throwaway database is gone afterwards.
    assert not Path(env["CAIRNQ_SQLITE_TEST_FILE"]).exists()


@pytest.mark.slow
def test_cli_exits_non_zero_on_a_failing_scenario(db, tmp_path):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    good = scenario(SUBMIT, {"op": "get", "args": {"id": "$t.id"},
                             "expect": {"equals": {"status": "queued"}}})
    bad = scenario(SUBMIT, {"op": "get", "args": {"id": "$t.id"},
                            "expect": {"equals": {"status": "running"}}})
    (folder / "a_good.json").write_text(json.dumps({**good, "name": "good"}))
    (folder / "b_bad.json").write_text(json.dumps({**bad, "name": "bad"}))
    proc = _run_cli(_cli_env(tmp_path), folder, settings_flag=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "PASS good" in lines
    assert any(line.startswith("FAIL bad (step 2): get: Expected status") for line in lines)
    assert lines[-1] == "1 passed, 1 failed"


def test_cli_reports_a_missing_folder(tmp_path):
    proc = _run_cli(_cli_env(tmp_path), tmp_path / "nowhere")
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr


def test_cli_reports_an_unknown_database_alias(tmp_path):
    (tmp_path / "one.json").write_text(json.dumps(scenario(SUBMIT)))
    proc = _run_cli(_cli_env(tmp_path), tmp_path, "--database", "nosuch")
    assert proc.returncode == 2
    assert "There is no database alias 'nosuch' in DATABASES." in proc.stderr


def test_cli_needs_settings(tmp_path):
    env = _cli_env(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "cairnq_django.conformance", str(tmp_path)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "Pass --settings or set DJANGO_SETTINGS_MODULE." in proc.stderr
