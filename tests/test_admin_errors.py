"""The task page's error: code, type and message, then the traceback as a preformatted block.

The error column is written by every peer (this worker, the cairnq SDK, the
TypeScript SDK, a hand-written UPDATE), so the page shows what it can of any
JSON and never answers 500.
"""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from django.db import connection
from django.urls import reverse

from cairnq_django.admin.display import error_block
from cairnq_django.testing import run_tasks
from cairnq_django.worker.registry import Registry

from .storeutil import make

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "shop/tasks.py", line 12, in send_receipt\n'
    "    raise ValueError(f\"no <b>email</b> for {order}\")\n"
    "ValueError: no <b>email</b> for order 7\n"
)


def detail_url(task_id: str) -> str:
    return reverse("admin:cairnq_django_task_change", args=[task_id])


def write_error(task_id: str, text: str) -> None:
    """Store `text` (JSON) in a task's error column, as a foreign writer would."""
    cast = "::jsonb" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE cairnq_tasks SET error = %s{cast} WHERE id = %s", [text, task_id])


def error_section(page: str) -> str:
    """The HTML of the page's error field."""
    match = re.search(r'<div class="[^"]*field-error_json.*?(?=<div class="[^"]*form-row|</fieldset>)',
                      page, re.S)
    assert match, "no error field on the page"
    return match.group(0)


def test_a_handler_traceback_is_a_readable_block_below_code_type_and_message(admin_client, store):
    task = make(store, "failed", "send_receipt", max_attempts=1)
    envelope = {
        "type": "ValueError", "code": "handler_error", "retryable": True,
        "message": "no <b>email</b> for order 7", "details": {"traceback": TRACEBACK},
    }
    write_error(task.id, json.dumps(envelope))

    response = admin_client.get(detail_url(task.id))

    assert response.status_code == 200
    section = error_section(response.content.decode())
    # The traceback keeps its lines (real newlines, not "\n" escapes), escaped.
    block = re.search(r'<pre class="cq-traceback">(.*?)</pre>', section, re.S)
    assert block, section
    assert htmllib.unescape(block.group(1)) == TRACEBACK
    assert "<b>email</b>" not in section
    # Code, type and message come first, each in its own row.
    rows = re.findall(r'<th scope="row">(\w+)</th><td class="cq-error-\w+">(.*?)</td>', section, re.S)
    assert [(label, htmllib.unescape(value)) for label, value in rows] == [
        ("code", "handler_error"), ("type", "ValueError"),
        ("message", "no <b>email</b> for order 7"), ("retryable", "true"),
    ]
    assert section.index("cq-error-message") < section.index("cq-traceback")
    # The envelope as stored is still there, folded.
    assert "<details class=\"cq-error-json\">" in section and "&quot;details&quot;" in section


def test_the_workers_own_envelope_shows_its_traceback(admin_client, store):
    registry = Registry()

    def explode(ctx, payload):
        raise RuntimeError("upstream said <no>")

    registry.register("explode", explode, max_attempts=1)
    with run_tasks(registry=registry) as tasks:
        task = store.submit("explode", max_attempts=1)
        tasks.drain()

    section = error_section(admin_client.get(detail_url(task.id)).content.decode())
    block = re.search(r'<pre class="cq-traceback">(.*?)</pre>', section, re.S)
    assert block, section
    text = htmllib.unescape(block.group(1))
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.rstrip().endswith("RuntimeError: upstream said <no>")


FOREIGN_ERRORS = [
    pytest.param('{"code": "boom"}', ["boom"], id="code-only"),
    pytest.param('{}', [], id="empty-object"),
    pytest.param('"a plain string"', ["a plain string"], id="a-string"),
    pytest.param("[1, 2, 3]", [], id="a-list"),
    pytest.param("42", ["42"], id="a-number"),
    pytest.param("null", [], id="json-null"),
    pytest.param('{"code": 7, "type": null, "message": ["a", {"b": 1}], "retryable": "maybe"}',
                 ["7", "null", '[&quot;a&quot;, {&quot;b&quot;: 1}]', "maybe"], id="odd-types"),
    pytest.param('{"message": "x", "details": "not an object"}', ["x"], id="details-a-string"),
    pytest.param('{"message": "x", "details": {"traceback": 5}}', ["x"], id="traceback-a-number"),
    pytest.param('{"message": "x", "details": {"traceback": ["a", 1]}}', ["x"], id="traceback-mixed"),
    pytest.param('{"message": "m\\nline two", "details": {"stack": "Error: m\\n    at f (a.js:1:2)"}}',
                 ["Error: m\n    at f (a.js:1:2)"], id="typescript-stack"),
    pytest.param('{"details": {"stack": ["at f (a.js:1)", "at g (a.js:2)"]}}',
                 ["at f (a.js:1)\nat g (a.js:2)"], id="stack-as-lines"),
    pytest.param('{"message": "<script>alert(1)</script>"}',
                 ["&lt;script&gt;alert(1)&lt;/script&gt;"], id="markup"),
    pytest.param('{"message": ' + "[" * 400 + "]" * 400 + "}", ["[[[["], id="nested-message"),
]


@pytest.mark.parametrize(("stored", "shown"), FOREIGN_ERRORS)
def test_errors_of_any_shape_from_other_writers_render(admin_client, store, stored, shown):
    task = make(store, "failed", "foreign", max_attempts=1)
    write_error(task.id, stored)

    response = admin_client.get(detail_url(task.id))

    assert response.status_code == 200
    section = error_section(response.content.decode())
    assert "<script>" not in section
    for text in shown:
        assert text in htmllib.unescape(section) or text in section, (text, section)


def test_a_lone_surrogate_in_a_message_is_shown_escaped(admin_client, store):
    if connection.vendor == "postgresql":
        pytest.skip("jsonb refuses a lone surrogate escape; only SQLite can store one")
    task = make(store, "failed", "foreign", max_attempts=1)
    write_error(task.id, '{"message": "half \\ud800 a pair", "details": {"traceback": "\\udc00"}}')

    response = admin_client.get(detail_url(task.id))

    assert response.status_code == 200
    section = error_section(response.content.decode())
    assert "half \\ud800 a pair" in section
    assert '<pre class="cq-traceback">\\udc00</pre>' in section


@pytest.mark.parametrize("raw", [None, b"\xff", "{not json", '"x"', "[" * 5000 + "]" * 5000])
def test_error_block_never_raises(raw):
    rendered = str(error_block(raw))
    rendered.encode()  # writable as UTF-8
