"""How the admin shows times, durations and the free-text columns of a task.

Pure functions of a value: no queries, no admin state. The free-text columns
come from foreign writers, so nothing here trusts them to be UTF-8 or JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from ..humanize import progress_percent


def ms_to_datetime(ms: int | None) -> datetime | None:
    """Return an aware UTC datetime for epoch milliseconds (None stays None)."""
    if ms is None:
        return None
    # Integer arithmetic: a float division can round 455 ms down to 454.999.
    return datetime.fromtimestamp(ms // 1000, tz=UTC).replace(microsecond=ms % 1000 * 1000)


def format_time(ms: int | None) -> str:
    """Render epoch milliseconds as a local date and time to the millisecond."""
    moment = ms_to_datetime(ms)
    if moment is None:
        return "-"
    return format_html('<time datetime="{}">{}</time>', moment.isoformat(), _to_the_ms(moment))


def _to_the_ms(moment: datetime) -> str:
    """Local date and time to the millisecond, with the zone's abbreviation."""
    local = timezone.localtime(moment)
    return (
        f"{dateformat.format(local, 'Y-m-d H:i:s')}.{local.microsecond // 1000:03d}"
        f" {dateformat.format(local, 'T')}"
    )


def compact_time(ms: int | None) -> str:
    """Render epoch milliseconds for a list column: local date and time to the second.

    The date and the time are two unbreakable pieces (a narrow column puts the
    time under the date, never half a date on each line); the title has the
    millisecond and the zone.
    """
    moment = ms_to_datetime(ms)
    if moment is None:
        return "-"
    local = timezone.localtime(moment)
    full = _to_the_ms(moment)
    return format_html(
        '<time datetime="{}" title="{}"><span class="cq-nowrap">{}</span> '
        '<span class="cq-nowrap">{}</span></time>',
        moment.isoformat(), full, dateformat.format(local, "Y-m-d"), dateformat.format(local, "H:i:s"),
    )


# Enough of a ULID's tail to tell the tasks of a page apart: its head is the
# creation time, alike for tasks enqueued together; its tail is random.
SHORT_ID_CHARS = 8


def time_field(
    column: str, description: Any, show: Callable[[int | None], str] = format_time,
    ordering: str | None = None,
) -> Callable[[Any, Any], str]:
    """An admin column showing a row's ``column`` (epoch milliseconds) with ``show``."""

    @admin.display(description=description, ordering=ordering)
    def field(self: Any, row: Any) -> str:
        return show(getattr(row, column))

    return field


def short_id(task_id: str) -> str:
    """A task id short enough for the list: `…` and its last characters (short ids stay whole)."""
    if len(task_id) <= SHORT_ID_CHARS + 4:
        return task_id
    return "…" + task_id[-SHORT_ID_CHARS:]


_BREAK_AFTER = re.compile(r"([._:/-]+)")


def breakable(text: str) -> SafeString:
    """Escape `text` with a line-break chance after each . _ : / -, never inside a word."""
    parts = _BREAK_AFTER.split(text)
    return format_html_join("", "{}{}", (
        (part, mark_safe("<wbr>") if index % 2 else "")  # noqa: S308  (a constant tag)
        for index, part in enumerate(parts)
    ))


def progress_html(progress: float | None) -> str:
    """A progress bar with its percent, "-" for none, or "invalid" for a value no percent shows."""
    if progress is None:
        return "-"
    percent = progress_percent(progress)
    if percent is None:
        return format_html(
            '<span class="cq-progress-invalid" title="{}">{}</span>',
            _("The stored progress is not a number from 0 to 1."),
            _("invalid"),
        )
    return format_html(
        '<span class="cq-nowrap"><progress class="cq-progress" max="100" value="{}">'
        "</progress> {}%</span>",
        percent,
        percent,
    )


def decode_raw(raw: object) -> tuple[str | None, str | None]:
    """Return (text, note): a column read raw as text, and why it is not valid if it is not."""
    if raw is None:
        return None, None
    if isinstance(raw, memoryview):
        raw = bytes(raw)
    if isinstance(raw, (bytes, bytearray)):
        try:
            return bytes(raw).decode(), None
        except UnicodeDecodeError:
            return bytes(raw).decode(errors="replace"), str(_(
                "This is not valid JSON: the stored text is not valid UTF-8 (undecodable bytes"
                " are shown as U+FFFD)."
            ))
    return str(raw), None


def pretty_json(text: str) -> str | None:
    """Pretty-print JSON text, or None if Python's decoder (or encoder) refuses it."""
    try:
        value = json.loads(text)
        pretty = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None
    try:
        pretty.encode()
    except UnicodeEncodeError:
        # A string holding an unpaired surrogate: valid JSON, but not writable
        # as UTF-8, so spell it with escapes.
        pretty = json.dumps(value, indent=2, sort_keys=True)
    return pretty


def json_block(raw: object) -> SafeString | str:
    """Render a JSON column read raw; never raises on what the row holds."""
    text, note = decode_raw(raw)
    if text is None:
        return "-"
    pretty = None if note else pretty_json(text)
    # format_html escapes the text, so a payload cannot inject markup.
    if pretty is not None:
        return format_html('<pre class="cq-json">{}</pre>', pretty)
    if note is None:
        note = str(_(
            "This is not valid JSON to Python's decoder (malformed, or nested too deeply);"
            " shown as stored."
        ))
    return format_html(
        '<p class="help cq-json-invalid">{}</p><pre class="cq-json cq-json-raw">{}</pre>',
        note,
        text,
    )


# Where the peers put a stack trace in an error envelope's details: this
# worker and the cairnq SDK write "traceback", JavaScript writers "stack".
TRACEBACK_KEYS = ("traceback", "stack")
ERROR_FIELDS = (("code", _("code")), ("type", _("type")), ("message", _("message")),
                ("retryable", _("retryable")))


def _writable(text: str) -> str:
    """Text that encodes as UTF-8: a lone surrogate (valid in JSON) becomes its escape."""
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def _as_text(value: object) -> str:
    """A field of a foreign envelope as text: strings as they are, anything else as JSON."""
    if isinstance(value, str):
        return _writable(value)
    return _writable(json.dumps(value, sort_keys=True, ensure_ascii=False))


def _traceback_of(details: object) -> str | None:
    """The stack trace in an envelope's details, if a writer left one we can show as text."""
    if not isinstance(details, dict):
        return None
    for key in TRACEBACK_KEYS:
        trace = details.get(key)
        if isinstance(trace, str) and trace.strip():
            return _writable(trace)
        if isinstance(trace, list) and trace and all(isinstance(line, str) for line in trace):
            # A list of lines (traceback.format_list keeps their newlines; others do not).
            joined = "".join(trace) if all(line.endswith("\n") for line in trace) else "\n".join(trace)
            return _writable(joined)
    return None


def error_block(raw: object) -> SafeString | str:
    """Render the error column: code, type and message, then the traceback as a block.

    The envelope comes from any writer, so every part is optional and may be
    of any JSON type; what is not an object (or not JSON) is shown as
    json_block shows it. The whole envelope stays below, folded.
    """
    text, note = decode_raw(raw)
    if text is not None and note is None:
        try:
            envelope = json.loads(text)
            if isinstance(envelope, dict):
                return _envelope_block(envelope, raw)
        except (ValueError, RecursionError):  # not JSON, or a field too deep to print again
            pass
    return json_block(raw)


def _envelope_block(envelope: dict[str, object], raw: object) -> SafeString:
    rows = format_html_join(
        "", '<tr><th scope="row">{}</th><td class="cq-error-{}">{}</td></tr>',
        ((label, field, _as_text(envelope[field])) for field, label in ERROR_FIELDS
         if field in envelope),
    )
    summary = format_html('<table class="cq-error"><tbody>{}</tbody></table>', rows) if rows else ""
    trace = _traceback_of(envelope.get("details"))
    trace_block = (
        format_html(
            '<p class="cq-error-heading">{}</p><pre class="cq-traceback">{}</pre>',
            _("traceback"), trace,
        )
        if trace is not None
        else ""
    )
    return format_html(
        '{}{}<details class="cq-error-json"><summary>{}</summary>{}</details>',
        summary, trace_block, _("the error as stored (JSON)"), json_block(raw),
    )
