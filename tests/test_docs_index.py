"""docs/index.md links every page of docs/ exactly once, and only pages that exist."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
# Pages other branches are writing, linked ahead of them (from-celery.md links workflows.md).
PENDING = {"workflows.md"}


def _index_links() -> list[str]:
    return re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", (DOCS / "index.md").read_text())


def test_every_page_is_linked_from_the_index_once():
    pages = sorted(p.name for p in DOCS.glob("*.md") if p.name != "index.md")
    links = _index_links()
    assert sorted(set(links)) == pages
    assert [link for link in links if links.count(link) > 1] == []


def test_the_index_mentions_flow_limits():
    assert "LIMITS" in (DOCS / "index.md").read_text()


def test_links_between_pages_name_pages_that_exist():
    missing = []
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", page.read_text()):
            if not (DOCS / target).exists() and target not in PENDING:
                missing.append((page.name, target))
    assert missing == []
