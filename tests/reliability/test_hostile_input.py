"""Hostile input: refused whole with a clear error, or stored and read back exactly.

And rows a foreign writer put in the table (an unregistered name that looks like
a Python path, a payload that is not an object, one this process cannot decode)
never make a real worker process import anything, crash or stall.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connections

from cairnq_django import SerializationError, enqueue, enqueue_many, get
from cairnq_django.ids import new_task_id
from cairnq_django.jsoncodec import MAX_DEPTH
from tests.workerutil import WorkerProcess, wait_for


def nested(depth: int) -> list:
    outer: list = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def task_rows() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM cairnq_tasks")
        return cursor.fetchone()[0]


FUTURE = datetime(2030, 1, 1, tzinfo=UTC)

# (case id, enqueue keyword arguments, the exception, words its message must hold)
REFUSED = [
    ("int-and-str-key-collide", {"payload": {1: "a", "1": "b"}}, SerializationError, "int key 1"),
    ("tuple-key", {"payload": {(1, 2): "a"}}, SerializationError, "tuple key"),
    ("lone-surrogate", {"payload": {"a": "\ud800"}}, SerializationError, "lone surrogate"),
    ("lone-surrogate-key", {"payload": {"\udfff": 1}}, SerializationError, "lone surrogate"),
    ("nul-in-payload", {"payload": ["ok", "a\x00b"]}, SerializationError, "NUL"),
    ("nul-in-payload-key", {"payload": {"k\x00": 1}}, SerializationError, "NUL"),
    ("nul-in-metadata", {"metadata": {"m": "\x00"}}, SerializationError, "metadata"),
    ("surrogate-in-metadata", {"metadata": {"m": "\ud83d"}}, SerializationError, "metadata"),
    ("int-key-in-metadata", {"metadata": {2: "x"}}, SerializationError, "metadata"),
    ("metadata-not-dict", {"metadata": ["x"]}, ValueError, "metadata must be a dict"),
    ("nan", {"payload": {"x": float("nan")}}, SerializationError, "not JSON-serializable"),
    ("infinity", {"payload": [float("inf")]}, SerializationError, "not JSON-serializable"),
    ("bytes", {"payload": {"b": b"raw"}}, SerializationError, "bytes"),
    ("set", {"payload": {"s": {1, 2}}}, SerializationError, "set"),
    ("datetime", {"payload": {"at": FUTURE}}, SerializationError, "datetime"),
    ("decimal", {"payload": {"d": Decimal("1.10")}}, SerializationError, "Decimal"),
    ("object", {"payload": {"o": object()}}, SerializationError, "object"),
    ("int-of-5000-digits", {"payload": {"n": 10**5000}}, SerializationError, "digits"),
    ("nesting-10000", {"payload": nested(10_000)}, SerializationError, "deeper than 512"),
    ("nesting-max-plus-one", {"payload": nested(MAX_DEPTH + 1)}, SerializationError, "deeper"),
    ("nul-in-name", {"name": "send\x00mail"}, ValueError, "Task name"),
    ("surrogate-in-name", {"name": "send\ud800"}, ValueError, "Task name"),
    ("empty-name", {"name": ""}, ValueError, "Task name"),
    ("name-not-str", {"name": 7}, ValueError, "Task name"),
    ("nul-in-queue", {"queue": "q\x00"}, ValueError, "Queue"),
    ("nul-in-key", {"key": "k\x00"}, ValueError, "key"),
    ("empty-key", {"key": ""}, ValueError, "key"),
    ("nul-in-correlation-id", {"correlation_id": "c\x00"}, ValueError, "correlation_id"),
    ("correlation-id-int", {"correlation_id": 123}, ValueError, "correlation_id"),
    ("correlation-id-dict", {"correlation_id": {}}, ValueError, "correlation_id"),
    ("name-too-long", {"name": "n" * 256}, ValueError, "at most 255"),
    ("queue-too-long", {"queue": "q" * 256}, ValueError, "at most 255"),
    ("key-too-long", {"key": "k" * 513}, ValueError, "at most 512"),
    ("correlation-id-too-long", {"correlation_id": "c" * 256}, ValueError, "at most 255"),
    ("priority-over-int32", {"priority": 2**31}, ValueError, "priority"),
    ("priority-under-int32", {"priority": -(2**31) - 1}, ValueError, "priority"),
    ("priority-bool", {"priority": True}, ValueError, "priority"),
    ("priority-float", {"priority": 1.0}, ValueError, "priority"),
    ("max-attempts-over-int32", {"max_attempts": 2**31}, ValueError, "max_attempts"),
    ("max-attempts-zero", {"max_attempts": 0}, ValueError, "max_attempts"),
    ("max-attempts-bool", {"max_attempts": True}, ValueError, "max_attempts"),
    ("max-attempts-float", {"max_attempts": 3.0}, ValueError, "max_attempts"),
    ("delay-infinite", {"delay": float("inf")}, ValueError, "finite"),
    ("delay-nan", {"delay": float("nan")}, ValueError, "finite"),
    ("delay-2**70", {"delay": 2**70}, ValueError, "too far in the future"),
    ("delay-huge-timedelta", {"delay": timedelta(days=999_999_999)}, ValueError, "too far"),
    ("delay-negative", {"delay": -1}, ValueError, "negative"),
    ("delay-str", {"delay": "5"}, ValueError, "delay"),
    ("run-at-str", {"run_at": "2030-01-01"}, ValueError, "run_at"),
    ("run-at-naive", {"run_at": datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
    ("delay-and-run-at", {"delay": 5, "run_at": FUTURE}, ValueError, "either delay or run_at"),
    ("unknown-conflict", {"key": "k", "conflict": "merge"}, ValueError, "conflict"),
]


def _enqueue_kwargs(case: dict) -> tuple[str, dict]:
    kwargs = dict(case)
    name = kwargs.pop("name", "tests.echo")
    return name, kwargs


@pytest.mark.parametrize(
    "kwargs, error, words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_enqueue_refuses_with_a_clear_error_and_writes_nothing(store, kwargs, error, words):
    name, options = _enqueue_kwargs(kwargs)
    with pytest.raises(error) as raised:
        enqueue(name, **options)
    assert words in str(raised.value)
    assert task_rows() == 0


@pytest.mark.parametrize("batch", [1, 250], ids=["insert", "bulk-path"])
@pytest.mark.parametrize(
    "kwargs, error, words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_enqueue_many_refuses_the_whole_batch(store, kwargs, error, words, batch):
    """One bad item among many (Postgres's COPY path from 200) fails all of them."""
    name, options = _enqueue_kwargs(kwargs)
    good = [{"name": "tests.echo", "payload": {"i": i}} for i in range(batch)]
    with pytest.raises(error) as raised:
        enqueue_many([*good, {"name": name, **options}])
    assert words in str(raised.value)
    assert task_rows() == 0


# Values that are JSON and storable: they must read back exactly as JSON reads them.
STORED = [
    ("nesting-at-max", {"payload": nested(MAX_DEPTH)}),
    ("emoji-and-accents", {"payload": {"e": "😀", "ü": "ñ", "cjk": "漢字"}}),
    ("escapes-as-text", {"payload": {"s": "\\u0000 and \\ud800 as plain text", "q": '"<x>"'}}),
    ("control-characters", {"payload": {"c": "\t\n\r\x01\x1f\x7f"}}),
    ("tuple-is-an-array", {"payload": {"t": (1, 2, (3,))}}),
    ("big-and-small-numbers",
     {"payload": [2**63, -(2**63), 2**64 + 1, 1e308, 5e-324, 0.1, 1 / 3, 3.141592653589793]}),
    ("not-an-object", {"payload": [1, "two", None, True]}),
    ("a-bare-string", {"payload": "just text"}),
    ("four-byte-characters-at-the-limits",
     {"name": "😀" * 255, "queue": "🜁" * 255, "key": "🔑" * 512, "correlation_id": "c" * 255}),
    ("int32-limits", {"priority": -(2**31), "max_attempts": 2**31 - 1}),
    ("far-future-run-at", {"run_at": datetime(9999, 12, 31, tzinfo=UTC)}),
    ("metadata-nested", {"metadata": {"trace": {"id": "abc", "spans": [1, 2]}}}),
]


def _json_view(value):
    """What a JSON round trip makes of a value (tuples become lists)."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("kwargs", [c[1] for c in STORED], ids=[c[0] for c in STORED])
def test_storable_values_read_back_exactly(store, kwargs):
    name, options = _enqueue_kwargs(kwargs)
    task = enqueue(name, **options)
    row = get(task.id)
    assert row.name == name
    assert row.payload == _json_view(options.get("payload", {}))
    assert row.metadata == _json_view(options.get("metadata", {}))
    for field in ("queue", "correlation_id", "priority", "max_attempts"):
        if field in options:
            assert getattr(row, field) == options[field]
    if "key" in options:
        assert store.get_by_key(options["key"]).id == task.id


@pytest.mark.slow
def test_a_50_mb_payload_reads_back_exactly(store):
    payload = {"blob": "x" * 50_000_000, "tail": "😀"}
    task = enqueue("tests.echo", payload)
    assert get(task.id).payload == payload


def test_a_handler_error_holding_a_nul_still_settles(store):
    """An exception message that no database can store must not strand the task running."""
    task = enqueue("tests.echo", {})
    [claimed] = store.claim(queues=["default"], worker_id="w1")
    row = store.fail(claimed.id, "w1", RuntimeError("bad \x00 byte \ud800"), retryable=False)
    assert row.status == "failed"
    assert row.error["message"] == "bad \\u0000 byte ?"
    assert task.id == row.id


def test_a_progress_message_holding_a_nul_is_refused(store):
    enqueue("tests.echo", {})
    [claimed] = store.claim(queues=["default"], worker_id="w1")
    with pytest.raises(ValueError, match="progress message"):
        store.progress(claimed.id, "w1", 0.5, "half\x00way")
    with pytest.raises(ValueError, match="message must be a string"):
        store.progress(claimed.id, "w1", 0.5, 42)


# ------------------------------------------------------------ foreign rows


def insert_raw(name: str, payload_sql: str, params: list, *, priority: int = 0) -> str:
    """Insert a queued row the way a foreign writer might, bypassing every check here."""
    task_id = new_task_id()
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "INSERT INTO cairnq_tasks (id, name, queue, status, payload, metadata,"
            " max_attempts, priority, run_at_ms, root_id, created_at_ms, updated_at_ms)"
            f" VALUES (%s, %s, 'default', 'queued', {payload_sql}, '{{}}', 3, %s, 0, %s, 0, 0)",
            [task_id, name, *params, priority, task_id],
        )
    return task_id


def _python_refuses(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return True
    return False


def poison_payloads() -> list[tuple[str, str, list]]:
    """(what, SQL, params) for payloads this database accepts and Python cannot decode.

    How deep Python's decoder goes depends on its version (3.13 reads 5,000
    levels), so a depth case is used only where this interpreter refuses it.
    """
    digits = '{"n": ' + "7" * 5000 + "}"  # past int's 4,300-digit limit, fine for jsonb
    if connections["default"].vendor == "postgresql":
        cases = [("a 5,000-digit number", "%s::jsonb", [digits])]
        deep = "[" * 5000 + "]" * 5000  # jsonb's own limit is near 20,000 here
    else:
        cases = [
            ("a 5,000-digit number", "%s", [digits]),
            ("not UTF-8", "cast(x'7b2261223a22ff227d' as text)", []),
        ]
        deep = "[" * 2000 + "]" * 2000  # SQLite's json_valid() takes 2,000 levels
    if _python_refuses(deep):
        cases.append(("nested too deep", cases[0][1], [deep]))
    return cases


def status_of(task_id: str) -> tuple:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT status, attempt, CAST(error AS TEXT) FROM cairnq_tasks WHERE id = %s",
            [task_id],
        )
        return cursor.fetchone()


def test_a_poison_row_fails_alone_and_the_queue_keeps_moving(live_store, child_env):
    """Defect: decoding in the claim stopped SQLite's queue and burned Postgres's batch."""
    good = [enqueue("tests.echo", {"i": i}).id for i in range(20)]
    poison = {
        what: insert_raw("tests.echo", sql, params, priority=10)
        for what, sql, params in poison_payloads()
    }
    later = [enqueue("tests.echo", {"i": i}).id for i in range(20, 30)]
    worker = WorkerProcess(child_env, "--concurrency", "8", "-v", "2")
    try:
        wait_for(
            lambda: all(get(t).status == "succeeded" for t in good + later),
            timeout=90, message="the good tasks did not all succeed behind a poison row",
        )
        wait_for(lambda: all(status_of(t)[0] == "failed" for t in poison.values()), timeout=30)
        assert worker.proc.poll() is None, worker.output()
    finally:
        worker.stop()
    for task_id in good + later:
        assert get(task_id).attempt == 1
    for what, task_id in poison.items():
        row = get(task_id)
        assert row.status == "failed" and row.attempt == 1, what
        assert row.error["code"] == "undecodable_payload", what
        assert row.error["retryable"] is False
        assert row.payload.reason  # the raw text stays readable through the store
        assert row.lease_until_ms is None and row.completed_at_ms is not None


def test_foreign_rows_never_make_the_worker_import_anything(live_store, child_env, tmp_path):
    """Unregistered names are never claimed, let alone imported; odd payloads just run."""
    marker = tmp_path / "imported"
    traps = [
        insert_raw(name, "%s", [f'{{"cmd": "touch {marker}"}}'])
        for name in ("os.system", "subprocess.run", "builtins.eval", "tests.testapp.tasks.echo")
    ]
    odd = {
        "array": insert_raw("tests.echo", "%s", ["[1, 2, 3]"]),
        "number": insert_raw("tests.echo", "%s", ["42"]),
        "null": insert_raw("tests.echo", "%s", ["null"]),
        "string": insert_raw("tests.echo", "%s", ['"text"']),
    }
    after = enqueue("tests.echo", {"last": True}).id
    worker = WorkerProcess(child_env, "-v", "2")
    try:
        wait_for(lambda: get(after).status == "succeeded", timeout=60)
        wait_for(lambda: all(get(t).is_terminal for t in odd.values()), timeout=30)
        assert worker.proc.poll() is None, worker.output()
    finally:
        worker.stop()
    for task_id in traps:
        row = get(task_id)
        assert (row.status, row.attempt, row.worker_id) == ("queued", 0, None)
    assert not Path(marker).exists()
    for what, task_id in odd.items():
        row = get(task_id)
        assert row.status == "succeeded", (what, row.error)
        assert row.result["echo"] == {"array": [1, 2, 3], "number": 42, "null": None,
                                      "string": "text"}[what]
