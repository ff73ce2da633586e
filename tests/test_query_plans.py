"""The protocol's queries search the protocol's indexes, on both databases.

Each operation runs for real while its statements are recorded; each recorded
statement is then explained with the same bound parameters. A statement that
stops using its index (a predicate SQLite cannot match against a partial index,
say, because a literal became a parameter) fails here, not in production at a
million rows. PostgreSQL is asked with sequential scans disabled, so the plan
shows whether an index can serve the query at all, whatever the table's size.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import pytest
from django.db import connection

from cairnq_django.retention import RetentionRule

VENDOR = connection.vendor


@contextmanager
def recorded():
    """Record (sql, params) of every statement run on the test connection."""
    statements: list[tuple[str, object]] = []

    def record(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield statements


def plan(sql: str, params) -> str:
    """The database's plan for one statement, as one lowercase text."""
    with connection.cursor() as cursor:
        if VENDOR == "sqlite":
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
            return "\n".join(str(row[-1]) for row in cursor.fetchall()).lower()
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        text = "\n".join(row[0] for row in cursor.fetchall()).lower()
        cursor.execute("SET LOCAL enable_seqscan = on")
        return text


def uses_index(text: str, *indexes: str) -> bool:
    """Does the plan search one of `indexes`?

    Where several protocol indexes could serve a query, PostgreSQL picks by its
    statistics; what must not happen is that none can.
    """
    if VENDOR == "sqlite":  # "USING INDEX x" / "USING COVERING INDEX x"
        return any(f"index {index}" in text for index in indexes)
    return any(f"using {index}" in text or f"on {index}" in text for index in indexes)


# The purge and retention filters' indexes: queue first where a queue is named.
BY_QUEUE = ("cairnq_tasks_queue_completed_idx", "cairnq_tasks_completed_idx")
BY_STATUS = ("cairnq_tasks_status_completed_idx", "cairnq_tasks_completed_idx")


def full_scans(text: str) -> bool:
    if VENDOR == "sqlite":
        return any(line.strip().startswith("scan cairnq_tasks") and "index" not in line
                   for line in text.splitlines())
    return "seq scan on cairnq_tasks" in text


@pytest.fixture
def filled(store):
    """A few thousand tasks in every status, and fresh planner statistics."""
    store.submit_many([store.prepare("plan.a", {"i": i}, queue="q1") for i in range(1500)])
    store.submit_many([store.prepare("plan.b", {"i": i}, queue="q2") for i in range(1500)])
    with connection.cursor() as cursor:
        # Most finished, a few running (some with lapsed leases), some still queued.
        cursor.execute(
            "UPDATE cairnq_tasks SET status = 'succeeded', completed_at_ms = created_at_ms"
            " WHERE id IN (SELECT id FROM cairnq_tasks ORDER BY id LIMIT 2400)"
        )
        cursor.execute(
            "UPDATE cairnq_tasks SET status = 'running', worker_id = 'w', lease_until_ms = 1,"
            " attempt = 1 WHERE id IN (SELECT id FROM cairnq_tasks WHERE status = 'queued'"
            " ORDER BY id LIMIT 40)"
        )
        cursor.execute("ANALYZE cairnq_tasks" if VENDOR == "postgresql" else "ANALYZE")
    return store


def _bare(sql: str) -> str:
    """The statement without quotes and table qualifiers, as Django writes them."""
    return re.sub(r"%\(p\d+\)s", "%s", sql.replace('"', "").replace("cairnq_tasks.", ""))


def explain_each(statements, marker: str) -> list[str]:
    plans = [plan(sql, params) for sql, params in statements if marker in _bare(sql)]
    assert plans, f"no statement containing {marker!r} ran"
    return plans


@pytest.mark.parametrize("names, index", [
    (None, "cairnq_tasks_claim_idx"),
    (["plan.b"], "cairnq_tasks_claim_name_idx"),
])
def test_claim_and_lease_recovery_use_their_indexes(filled, names, index):
    with recorded() as statements:
        claimed = filled.claim(queues=["q2"], worker_id="w2", limit=5, names=names)
    assert claimed
    [recover] = explain_each(statements, "lease_until_ms <=")
    assert uses_index(recover, "cairnq_tasks_lease_idx"), recover
    claims = explain_each(statements, "SET status = %s, worker_id = %s")
    for text in claims:
        assert uses_index(text, index), text
        assert not full_scans(text), text


def test_purge_uses_the_queue_completed_index(filled):
    with recorded() as statements:
        deleted = filled.purge(older_than_ms=0, queue="q1", limit=100)
    assert len(deleted) == 100
    [text] = explain_each(statements, "DELETE FROM cairnq_tasks")
    assert uses_index(text, *BY_QUEUE), text
    if VENDOR == "sqlite":  # the literal status list lets SQLite match the partial index
        assert uses_index(text, "cairnq_tasks_queue_completed_idx"), text
    assert not full_scans(text), text


@pytest.mark.parametrize("rule", [
    RetentionRule(older_than_ms=0, queue="q2"),
    RetentionRule(older_than_ms=0, status="succeeded"),
], ids=["by-queue", "by-status"])
def test_the_retention_count_searches_an_index(filled, rule):
    with recorded() as statements:
        assert filled.count_purgeable(**rule.purge_filters()) > 0
    [text] = explain_each(statements, "COUNT(*)")
    assert uses_index(text, *(BY_QUEUE if rule.queue else BY_STATUS)), text
    assert not full_scans(text), text


def test_listing_by_status_searches_an_index(filled):
    with recorded() as statements:
        rows = filled.list(status="running", limit=10)
    assert len(rows) == 10
    [text] = explain_each(statements, "WHERE status = %s ORDER BY")
    assert not full_scans(text), text


def test_the_overviews_finished_count_searches_the_queue_index(filled):
    from cairnq_django.store.admin_reads import finished_since

    with recorded() as statements:
        counts = finished_since(filled.using, "q1", 0)
    assert sum(counts.values()) > 0
    [text] = explain_each(statements, "COUNT(")
    assert uses_index(text, *BY_QUEUE), text
    if VENDOR == "sqlite":  # terminal()'s literal status list matches the partial index
        assert uses_index(text, "cairnq_tasks_queue_completed_idx"), text
    assert not full_scans(text), text


def test_the_due_and_running_verbs_search_their_indexes(filled):
    """due() leads the claim index; running() matches the partial lease index (literal status)."""
    tasks, now = filled.tasks(), filled.clock_ms()
    with recorded() as statements:
        assert tasks.filter(queue="q2").due(now).count() > 0
        assert tasks.running().filter(lease_until_ms__lte=now).exists()
    due, running = (plan(sql, params) for sql, params in statements)
    assert uses_index(due, "cairnq_tasks_claim_idx", "cairnq_tasks_claim_name_idx"), due
    assert uses_index(running, "cairnq_tasks_lease_idx"), running
    assert not full_scans(due) and not full_scans(running), (due, running)


def test_the_idle_probe_reads_the_claim_name_index(filled):
    """The idle probe's next-due time comes from the per-name claim index's range, not a scan."""
    filled.submit("plan.b", queue="q2", delay_ms=60_000)
    with recorded() as statements:
        probe = filled.probe_idle(queues=["q2"], names=["plan.b"])
    assert probe.work
    [text] = explain_each(statements, "run_at_ms >")
    assert uses_index(text, "cairnq_tasks_claim_name_idx"), text
    assert not full_scans(text), text
