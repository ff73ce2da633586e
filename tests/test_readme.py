"""The README: what a new user meets first, and the claims it makes about the checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import override_settings

from cairnq_django.checks import check_database

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def sections() -> list[tuple[str, str]]:
    """(heading, body) of each `## ` section, in order."""
    parts = re.split(r"^## (.+)$", README, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_the_readme_starts_with_what_it_is_then_install_then_a_quick_start():
    headings = [heading for heading, _ in sections()]
    assert headings[:2] == ["Install", "Quick start"]
    before_install = README.split("\n## Install\n")[0]
    assert "task queue for Django" in before_install
    assert "scripts/" not in before_install
    quick_start = dict(sections())["Quick start"]
    assert "cairnq_django.enqueue(" in quick_start and "cairnq_worker" in quick_start


def test_the_contributor_scripts_stay_in_the_readme_after_the_user_part():
    developing = dict(sections())["Developing cairnq_django"]
    for command in ("./scripts/demo", "./scripts/test", "./scripts/lint"):
        assert command in developing
    user_part = README.split("\n## Contents\n")[0]
    assert "./scripts/" not in user_part


def test_install_names_only_sources_that_exist_a_checkout_or_a_built_wheel():
    install = dict(sections())["Install"]
    commands = re.findall(r"^pip install (.+?)(?:\s+#.*)?$", install, flags=re.MULTILINE)
    assert commands
    # Not on an index yet: every target is a path (a checkout or dist/*.whl).
    for target in commands:
        assert target.strip('"').startswith("/"), target
    assert "python -m build" in install


def sqlite(**options):
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3", "OPTIONS": options}


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_what_the_readme_says_about_w014_is_what_the_check_does():
    [sentence] = [s for s in re.split(r"(?<=[.:])\s", README) if "cairnq.W014" in s]
    match = re.search(r"`timeout`\s+is under (\d+) seconds", sentence)
    assert match, sentence
    limit = int(match.group(1))
    good = {
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    }

    def warns(**timeout):
        with override_settings(DATABASES={"default": sqlite(**good, **timeout)}):
            return [m.id for m in check_database()] == ["cairnq.W014"]

    assert warns(timeout=limit - 0.5)
    assert not warns(timeout=limit)
    # The README says a missing option (Python's 5 s) passes.
    assert "without the option" in sentence
    assert not warns()
