"""The claim's, the lease recovery's and the purge's SQL, as Django compiles them, kept in files.

The statements are built with the ORM (store/protocol_statements.py), so their
SQL text lives in no source file. Here each one is compiled for the test
database and compared with tests/sql_snapshots/django-<X.Y>/<vendor>/<name>.sql:
a Django release (or a queryset change) that rewrites a statement shows as a
diff in review. Each Django feature release has its own folder, as the
supported ones compile differently (6.1 quotes the subquery aliases, for
one); a release with no folder yet is skipped until it is written. After a
deliberate change, or for a new Django release, write the files and commit them:

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
RELEASE = "django-{}.{}".format(*django.VERSION[:2])
SNAPSHOTS = Path(__file__).parent / "sql_snapshots" / RELEASE / connection.vendor

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


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_compiled_sql_matches_its_snapshot(name):
    path = SNAPSHOTS / f"{name}.sql"
    text = render(name)
    if os.environ.get(UPDATE_VARIABLE) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if not path.parent.parent.exists():
        pytest.skip(f"No SQL snapshots for {RELEASE}: write them with {UPDATE_VARIABLE}=1.")
    assert path.exists(), f"No snapshot {path}: write it with {UPDATE_VARIABLE}=1."
    if path.read_text() != text:
        pytest.fail(
            f"The compiled {name} statement ({RELEASE}, {connection.vendor}) differs from {path}.\n"
            f"If the change is meant, run this test again with {UPDATE_VARIABLE}=1 and commit "
            f"the files; the diff shows the new SQL.\n\nCompiled now:\n{text}",
            pytrace=False,
        )
