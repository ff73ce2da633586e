"""Where the shared conformance scenarios are, and what a test does when they are absent.

A fresh clone has no scenario folder beside it, so by default the tests that need it skip,
all with the same one-line reason (pytest -rs folds them into one line). CI sets
CAIRNQ_REQUIRE_CONFORMANCE=1, and then a missing folder fails those tests instead.
"""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def scenario_dir() -> Path:
    """Return the scenario folder: CAIRNQ_CONFORMANCE_DIR, else ../shared beside the repo."""
    configured = os.environ.get("CAIRNQ_CONFORMANCE_DIR")
    if configured:
        return Path(configured)
    return REPO_ROOT.parent / "shared" / "conformance" / "scenarios"


def conformance_required() -> bool:
    return os.environ.get("CAIRNQ_REQUIRE_CONFORMANCE") == "1"


def missing_reason(directory: Path) -> str:
    """The one line every scenario test reports when the folder is absent."""
    return (
        f"conformance scenarios not found at {directory}: set CAIRNQ_CONFORMANCE_DIR "
        "to the scenario folder (CI sets CAIRNQ_REQUIRE_CONFORMANCE=1 and fails instead)"
    )


def skip_or_fail_without_scenarios() -> None:
    """Skip the calling test, or fail it under CAIRNQ_REQUIRE_CONFORMANCE=1.

    Raised from here (one file, one line) so that every skipped test folds into one line.
    """
    reason = missing_reason(scenario_dir())
    if conformance_required():
        pytest.fail(f"CAIRNQ_REQUIRE_CONFORMANCE=1 but {reason}", pytrace=False)
    pytest.skip(reason)
