"""How the admin shows times, durations and the free-text columns of a task.

Pure functions of a value: no queries, no admin state. The free-text columns
come from foreign writers, so nothing here trusts them to be UTF-8 or JSON.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _


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
    local = timezone.localtime(moment)
    text = (
        f"{dateformat.format(local, 'Y-m-d H:i:s')}.{local.microsecond // 1000:03d}"
        f" {dateformat.format(local, 'T')}"
    )
    return format_html('<time datetime="{}">{}</time>', moment.isoformat(), text)


def human_duration(ms: int | None) -> str:
    """Render milliseconds for a reader, in spaced units: 850 ms, 4.2 s, 3 min 5 s, 2 h 10 min.

    Not retention's compact spelling ("3m5s"), which reads back as a setting.
    """
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, whole_seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {whole_seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def valid_progress(progress: float | None) -> float | None:
    """The progress if it is a number from 0 to 1, else None.

    The store writes only such numbers, but another SDK or a direct write can
    leave NaN, ±Infinity or any other float in the column, and none of those
    is a percent (nor, for NaN and Infinity, JSON).
    """
    if progress is None or not math.isfinite(progress) or not 0.0 <= progress <= 1.0:
        return None
    return progress


def progress_percent(progress: float | None) -> int | None:
    """The progress as a whole percent, or None when there is none or it is invalid."""
    fraction = valid_progress(progress)
    return None if fraction is None else round(fraction * 100)


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
