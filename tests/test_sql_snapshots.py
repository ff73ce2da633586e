"""The claim's, the lease recovery's and the purge's SQL, as Django compiles them, kept in files.

The statements are built with the ORM (store/protocol_statements.py), so their
SQL text lives in no source file. Here each one is compiled for the test
database and compared with tests/sql_snapshots/django-<X.Y>/<vendor>/<name>.sql,
the file of the newest Django release at or below the one running: a Django
upgrade (or a queryset change) that rewrites a statement fails here, and its
new file shows the change as a diff in review. A release's folder holds only
the statements it compiles differently from the release before (6.1 quotes
the subquery aliases, for one). After a deliberate change, or for a new
Django release, write the files and commit them:

    CAIRNQ_UPDATE_SQL_SNAPSHOTS=1 CAIRNQ_TEST_DATABASE=sqlite pytest tests/test_sql_snapshots.py
    CAIRNQ_UPDATE_SQL_SNAPSHOTS=1 CAIRNQ_TEST_DATABASE=postgres pytest tests/test_sql_snapshots.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import django
import pytest
from django.db import connection

from cairnq_django.store.protocol_statements import CLAIM, CLAIM_IDS, PURGE, RECOVER

UPDATE_VARIABLE = "CAIRNQ_UPDATE_SQL_SNAPSHOTS"
ROOT = Path(__file__).parent / "sql_snapshots"
RELEASE = tuple(django.VERSION[:2])

# name: (statement, its shape, what it is). The shapes are the common ones;
# others differ only in how many placeholders a list has.
STATEMENTS = {
    "claim": (CLAIM, (1, None, 10), "the claim: one queue, any name, up to 10 tasks"),
    "claim_by_name": (CLAIM, (1, 1, 10), "the claim: one queue, one task name, up to 10 tasks"),
    "claim_ids": (CLAIM_IDS, (2,), "the limited claim's transition on two chosen tasks"),
    "recover": (RECOVER, (), "the lease recovery: expired leases requeued or failed"),
    "purge": (PURGE, (100, True, False, False), "the purge: up to 100 finished tasks of one queue"),
}

# A line break before each clause keyword, so that a change shows as a short diff.
_CLAUSE = re.compile(
    r" (?=(?:FROM|WHERE|AND|OR|ORDER BY|LIMIT|RETURNING|SET|FOR UPDATE|WHEN|ELSE|END|UNION) )"
)


def render(name: str) -> str:
    statement, shape, what = STATEMENTS[name]
    sql, params = statement.template("default", shape)
    return (
        f"-- {what}\n"
        f"-- parameters, in order: {', '.join(map(repr, params)) or 'none'}\n"
        + _CLAUSE.sub("\n", sql) + "\n"
    )


def folder(release: tuple[int, ...]) -> Path:
    return ROOT / "django-{}.{}".format(*release) / connection.vendor


def snapshot_of(name: str) -> Path | None:
    """The file of the newest release at or below the running one that holds `name`."""
    releases = sorted(
        (tuple(int(part) for part in path.name.removeprefix("django-").split(".")) for path in
         ROOT.glob("django-*")), reverse=True,
    )
    for release in releases:
        path = folder(release) / f"{name}.sql"
        if release <= RELEASE and path.exists():
            return path
    return None


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_compiled_sql_matches_its_snapshot(name):
    text = render(name)
    path = snapshot_of(name)
    if os.environ.get(UPDATE_VARIABLE) == "1" and (path is None or path.read_text() != text):
        path = folder(RELEASE) / f"{name}.sql"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path is not None, f"No snapshot of {name}: write it with {UPDATE_VARIABLE}=1."
    if path.read_text() != text:
        where = "Django {}.{}, ".format(*RELEASE) + connection.vendor
        pytest.fail(
            f"The compiled {name} statement ({where}) differs from {path}.\n"
            f"If the change is meant, run this test again with {UPDATE_VARIABLE}=1 and commit "
            f"the files; the diff shows the new SQL.\n\nCompiled now:\n{text}",
            pytrace=False,
        )
