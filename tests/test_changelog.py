"""CHANGELOG.md: an Unreleased section first, then each version with its migration notes."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()


def _sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", CHANGELOG, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_unreleased_comes_first_then_the_current_version():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    names = list(_sections())
    assert names[0] == "Unreleased"
    assert version in names


def test_every_section_has_migration_notes():
    for name, body in _sections().items():
        assert "### Migration notes" in body, name


def test_the_migrations_it_names_exist():
    named = set(re.findall(r"\b(0\d{3})\b", CHANGELOG))
    existing = {p.name[:4] for p in (ROOT / "cairnq_django" / "migrations").glob("0*.py")}
    assert named <= existing, named - existing


def test_the_sdist_ships_it():
    assert "include CHANGELOG.md" in (ROOT / "MANIFEST.in").read_text()
