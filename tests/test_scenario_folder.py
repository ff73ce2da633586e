"""Without the conformance scenarios a fresh clone skips their tests; CI requires them."""

import os
import subprocess
import sys

import pytest

from tests.scenario_folder import (
    REPO_ROOT,
    missing_reason,
    scenario_dir,
    skip_or_fail_without_scenarios,
)


@pytest.fixture
def no_scenarios(monkeypatch, tmp_path):
    missing = tmp_path / "no-scenarios-here"
    monkeypatch.setenv("CAIRNQ_CONFORMANCE_DIR", str(missing))
    monkeypatch.delenv("CAIRNQ_REQUIRE_CONFORMANCE", raising=False)
    return missing


def test_the_folder_named_by_the_environment_wins(no_scenarios):
    assert scenario_dir() == no_scenarios


def test_without_the_variable_the_folder_is_beside_the_checkout(monkeypatch):
    monkeypatch.delenv("CAIRNQ_CONFORMANCE_DIR", raising=False)
    assert scenario_dir() == REPO_ROOT.parent / "shared" / "conformance" / "scenarios"


def test_a_missing_folder_skips_with_one_line_naming_the_variable(no_scenarios):
    with pytest.raises(pytest.skip.Exception) as caught:
        skip_or_fail_without_scenarios()
    reason = str(caught.value)
    assert "\n" not in reason
    assert "CAIRNQ_CONFORMANCE_DIR" in reason
    assert str(no_scenarios) in reason


def test_a_missing_folder_fails_when_conformance_is_required(no_scenarios, monkeypatch):
    monkeypatch.setenv("CAIRNQ_REQUIRE_CONFORMANCE", "1")
    with pytest.raises(pytest.fail.Exception) as caught:
        skip_or_fail_without_scenarios()
    assert missing_reason(no_scenarios) in str(caught.value)


def _run_scenario_tests(tmp_path, **env):
    inherited = {k: v for k, v in os.environ.items() if k != "CAIRNQ_REQUIRE_CONFORMANCE"}
    env = {
        **inherited,
        # A throwaway SQLite test database of its own, whichever database this run uses.
        "CAIRNQ_TEST_DATABASE": "sqlite",
        "CAIRNQ_SQLITE_TEST_FILE": str(tmp_path / "scenario-folder.sqlite3"),
        "CAIRNQ_CONFORMANCE_DIR": str(tmp_path / "no-scenarios-here"),
        **env,
    }
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q",
        "tests/test_conformance.py", "-k", "scenario-folder-missing or shared_scenarios",
    ]
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_pytest_reports_the_missing_folder_as_one_skip_line(tmp_path):
    proc = _run_scenario_tests(tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    skip_lines = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skip_lines) == 1, output
    assert "CAIRNQ_CONFORMANCE_DIR" in skip_lines[0]
    assert "3 skipped" in output


@pytest.mark.slow
def test_pytest_fails_the_missing_folder_when_ci_requires_it(tmp_path):
    proc = _run_scenario_tests(tmp_path, CAIRNQ_REQUIRE_CONFORMANCE="1")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "3 failed" in output


def test_ci_requires_the_scenarios_before_it_runs_the_suite():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    required = ci.index("export CAIRNQ_REQUIRE_CONFORMANCE=1")
    assert required < ci.index("bash scripts/test")
    assert "../shared/conformance/scenarios" in ci
