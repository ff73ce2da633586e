"""JSON only across the boundary; a bad value writes nothing (PROTOCOL-NOTES: Errors and JSON)."""

from __future__ import annotations

import datetime
import decimal
import math

import pytest
from django.db import connection

from cairnq_django import ProtocolVersionMismatch, SerializationError
from cairnq_django.store.executor import forget_verified

from .storeutil import raw, run

NOT_JSON = [
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="infinity"),
    pytest.param(-math.inf, id="-infinity"),
    pytest.param({"x": [1, math.nan]}, id="nested-nan"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param({"when": datetime.datetime(2026, 1, 1)}, id="datetime"),
    pytest.param({"d": decimal.Decimal("1.5")}, id="decimal"),
    pytest.param({1, 2}, id="set"),
    pytest.param(object(), id="object"),
    pytest.param({("tuple", "key"): 1}, id="non-string-key"),
]


@pytest.mark.parametrize("value", NOT_JSON)
def test_payload_that_is_not_json_writes_nothing(store, value):
    with pytest.raises(SerializationError):
        store.submit("j", value)
    with pytest.raises(SerializationError):
        store.submit("j", {"ok": 1}, key="k", metadata={"bad": value})
    assert store.list() == [] and store.get_by_key("k") is None


@pytest.mark.parametrize("value", NOT_JSON[:3] + NOT_JSON[4:6])
def test_result_that_is_not_json_leaves_the_task_running(store, value):
    task = run(store, "j")
    with pytest.raises(SerializationError):
        store.complete(task.id, "w1", value)
    with pytest.raises(SerializationError):
        store.succeed(task.id, "w1", value)
    assert store.get(task.id).status == "running"


def test_serialization_error_is_a_value_error_with_a_sentence(store):
    with pytest.raises(ValueError) as info:
        store.submit("j", {"n": math.nan})
    # json's own words first, then ours.
    assert str(info.value).startswith("Out of range float values are not JSON compliant")
    assert ". The task payload is not JSON-serializable: payload['n'] is " in str(info.value)


@pytest.mark.parametrize(
    "value",
    [{"s": "ünïcødé ✓", "n": -2.5, "f": 0.1, "i": 2**53, "l": [True, False, None]}, [1, 2], "text", 3],
)
def test_json_values_round_trip(store, value):
    task = store.submit("j", value)
    assert store.get(task.id).payload == value
    claimed = run(store, "j2")
    assert store.complete(claimed.id, "w1", value).result == value
    assert store.get(claimed.id).result == value


def test_json_is_stored_without_language_specific_tokens(store):
    task = store.submit("j", {"a": 1.0, "b": "x"})
    [(text,)] = raw(
        store,
        "SELECT payload::text FROM cairnq_tasks WHERE id = %s"
        if connection.vendor == "postgresql"
        else "SELECT payload FROM cairnq_tasks WHERE id = %s",
        [task.id],
    )
    assert "NaN" not in text and "Infinity" not in text
    assert text.replace(" ", "") == '{"a":1.0,"b":"x"}'


@pytest.fixture
def protocol_version_2(store):
    raw(store, "UPDATE cairnq_meta SET value = '2' WHERE key = 'protocol_version'")
    forget_verified(store.using)
    yield store
    forget_verified(store.using)


def test_a_different_protocol_major_is_refused(protocol_version_2):
    store = protocol_version_2
    for operation in (
        lambda: store.submit("j"),
        lambda: store.get("task_x"),
        lambda: store.claim(queues=["default"], worker_id="w"),
    ):
        with pytest.raises(ProtocolVersionMismatch) as info:
            operation()
        assert "protocol_version '2'" in str(info.value)
    assert raw(store, "SELECT count(*) FROM cairnq_tasks")[0][0] == 0


def test_a_row_read_in_column_order_decodes_as_from_row_does():
    """The store's fast path (TaskRecord.from_sequence) against from_row."""
    from cairnq_django.records import COLUMNS, TaskRecord

    rows = [
        ("task_1", "n", "default", "queued", "{}", None, None, "{}", None, None,
         0, 3, 0, None, None, 1, None, None, "task_1", None, 1, 1, None),
        ("task_2", "n", "q", "failed", '{"a": [1, 2]}', b'"r"', b'{"code": "x"}', "not json",
         decimal.Decimal("0.5"), b"caf\xc3\xa9", 2, 3, -1, "w", 5, 1, 7, "task_1", "task_1",
         "c", 1, 2, 3),
        ("task_3", "n", "q", "running", b"\xff", "[]", None, '{"k": "v"}', 1, "m",
         1, 1, 0, "w", 9, 1, None, None, "task_3", None, 1, 1, None),
    ]
    for row in rows:
        fast, slow = TaskRecord.from_sequence(row), TaskRecord.from_row(dict(zip(COLUMNS, row, strict=True)))
        assert fast == slow
        assert [type(getattr(fast, c)) for c in COLUMNS] == [type(getattr(slow, c)) for c in COLUMNS]
        with pytest.raises(AttributeError):  # still frozen
            fast.status = "succeeded"  # type: ignore[misc]
    with pytest.raises(ValueError):
        TaskRecord.from_sequence(rows[0][:-1])
