"""Messages count and article right: "1 task", "2 tasks", "an int key"."""

from __future__ import annotations

import logging

import pytest

from cairnq_django import SerializationError, jsoncodec
from cairnq_django.errors import HeartbeatLate
from cairnq_django.retention.rules import RetentionRule, RuleResult


@pytest.mark.parametrize(
    ("key", "expected"),
    [(1, "has an int key 1;"), ((1, 2), "has a tuple key (1, 2);"), (None, "has a NoneType key None;")],
)
def test_a_non_string_key_is_named_with_the_right_article(key, expected):
    with pytest.raises(SerializationError) as caught:
        jsoncodec.dumps({key: "x"}, what="payload")
    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("deleted", "expected"),
    [(0, "failed tasks older than 1h"), (1, "failed task older than 1h"), (2, "failed tasks older than 1h")],
)
def test_a_rule_result_counts_its_tasks(deleted, expected):
    rule = RetentionRule(older_than_ms=3_600_000, status="failed")
    assert RuleResult(rule=rule, deleted=deleted, batches=1).description == expected
    assert str(rule) == "failed tasks older than 1h"


def test_the_late_heartbeat_message_counts_its_tasks():
    one = HeartbeatLate(late_ms=9, interval_ms=1, lease_ms=3, task_ids=["a"])
    assert str(one).endswith("; the lease of 1 in-flight task was at risk.")
    two = HeartbeatLate(late_ms=9, interval_ms=1, lease_ms=3, task_ids=["a", "b"])
    assert str(two).endswith("; the leases of 2 in-flight tasks were at risk.")


def test_the_sweepers_log_line_counts_its_batches(caplog):
    from cairnq_django.retention import RetentionSweeper

    rule = RetentionRule(older_than_ms=3_600_000, status="failed")
    sweeper = RetentionSweeper.__new__(RetentionSweeper)
    with caplog.at_level(logging.INFO, logger="cairnq_django.retention"):
        sweeper._log([RuleResult(rule=rule, deleted=1, batches=1)])
    assert caplog.messages == ["Retention deleted 1 failed task older than 1h in 1 batch."]
