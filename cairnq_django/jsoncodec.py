"""Strict JSON at the protocol boundary: no NaN, no Infinity, no Python objects.

Everything written must read back as the same value in every peer and be
storable in both databases: PostgreSQL's jsonb refuses NUL characters and lone
surrogates, and JSON itself has only string keys. Everything read must never
stop the reader: a row a foreign writer filled with text this decoder refuses
comes back as an `Undecodable`, for the one task to fail, not the statement.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from django.db.models import Model

from .errors import SerializationError

# Deeper than this is refused on write: Python's decoder recurses per level
# and gives up near the interpreter's recursion limit (1,000 frames), so a
# deeper value could be written by one process and be unreadable by a worker.
MAX_DEPTH = 512

# allow_nan=False because bare NaN/Infinity are not JSON and break the
# TypeScript peer; compact separators keep bytes identical to JSON.stringify.
_encoder = json.JSONEncoder(allow_nan=False, separators=(",", ":"))
_decoder = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored JSON column this process cannot decode, kept as (repaired) text."""

    raw: str
    reason: str

    def __str__(self) -> str:
        return self.raw


def dumps(value: Any, *, what: str = "value") -> str:
    """Encode value as strict JSON text or raise SerializationError."""
    if type(value) is dict and not value:
        return "{}"  # the default payload and metadata, without the encoder's setup
    _check_structure(value, what)
    try:
        text = _encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        problem = describe_unencodable(value, subscripts(what), JSON_ONLY.format(what="It"))
        # json's own words first ("Object of type datetime is not JSON serializable"), as
        # code matching on them expects; then which part it is and what to store instead.
        raise SerializationError(
            f"{exc}. The task {what} is not JSON-serializable: {problem}" if problem
            else f"The task {what} is not JSON-serializable: {exc}."
        ) from exc
    # The encoder escapes every non-ASCII and control character, so a NUL or a
    # surrogate can only be in a value whose text holds an escape.
    if "\\u" in text:
        for string in _strings(value):
            check_text(string, what=f"task {what}")
    if "e+" in text:
        text = _EXPONENT_OR_STRING.sub(_positional, text)
    return text


# A float of 1e16 or more is written as "1e+16", and PostgreSQL's jsonb keeps
# numbers as numerics: it reads that back as 10000000000000000, which Python
# decodes as an int. Written positionally with a ".0", it stays a float, and
# the text holds exactly the float's value, so every database and peer reads
# the same number back. String literals are matched too, only to skip them.
_EXPONENT_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?e\+\d+')


def _positional(match: re.Match[str]) -> str:
    token = match.group()
    if token.startswith('"'):
        return token
    return f"{int(float(token))}.0"


def _check_structure(value: Any, what: str) -> None:
    """Refuse non-string keys and nesting past MAX_DEPTH; the encoder judges the rest.

    Iterative, so a value nested 100,000 deep is refused with a message
    rather than a RecursionError.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    kind = type(key).__name__
                    article = "an" if kind[:1].lower() in "aeiou" else "a"
                    raise SerializationError(
                        f"The task {what} has {article} {kind} key {key!r}; JSON object "
                        "keys must be strings (convert it yourself, so two keys cannot "
                        "silently become one)."
                    )
            members: Any = item.values()
        elif isinstance(item, (list, tuple)):
            members = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise SerializationError(
                f"The task {what} is nested deeper than {MAX_DEPTH} levels; not every "
                "reader could decode it."
            )
        stack.extend((member, depth + 1) for member in members if isinstance(member, (dict, list, tuple)))


def _strings(value: Any) -> Any:
    """Every string in a value that passed _check_structure: keys and members."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


JSON_ONLY = (
    "{what} may hold only JSON values: dicts with string keys, lists, strings, finite "
    "numbers, booleans and None."
)


def describe_unencodable(
    value: Any,
    name: Callable[[tuple[Any, ...]], str],
    closing: str = "",
    *,
    framework: bool = False,
) -> str | None:
    """Say which part of `value` strict JSON cannot hold and what to use instead, or None.

    `name` turns the path to that part (keys and indexes from the top) into
    words: `payload['when']`, or "keyword argument 'when'" for a framework
    task. Every message about a value that is not JSON is built here, so the
    payload of `enqueue`, a framework task's arguments and a result read alike.
    `framework=True` accepts what the Tasks framework's normalize_json turns
    into JSON (any mapping or sequence, UTF-8 bytes).
    """
    found = find_unencodable(value, framework=framework)
    if found is None:
        return None
    path, bad = found
    return f"{name(path)} is {_kind(bad)}; {_instead(bad)}. {closing}".rstrip()


def subscripts(root: str) -> Callable[[tuple[Any, ...]], str]:
    """Name a path as Python subscripts of `root`: payload['items'][0]."""
    return lambda path: root + "".join(f"[{step!r}]" for step in path)


def find_unencodable(value: Any, *, framework: bool = False) -> tuple[tuple[Any, ...], Any] | None:
    """(path, part) of the first part of `value`, depth first, that is not a JSON value.

    Mapping keys are _check_structure's to judge; this looks at values only.
    """
    mappings, sequences = (Mapping, Sequence) if framework else (dict, (list, tuple))
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if item is None or isinstance(item, (str, int)):  # bool is an int
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return path, item
        elif isinstance(item, mappings):
            stack.extend(((*path, k), v) for k, v in reversed(list(item.items())))
        elif framework and isinstance(item, bytes):
            try:
                item.decode()
            except UnicodeDecodeError:
                return path, item
        elif isinstance(item, sequences):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(item))))
        else:
            return path, item
    return None


def _kind(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    cls = type(value)
    where = cls.__qualname__
    if cls.__module__ != "builtins":
        where = f"{cls.__module__}.{where}"
    article = "an" if where[0] in "aeioAEIO" else "a"  # a uuid, an int
    if isinstance(value, Model):
        return f"{article} {where} model instance"
    return f"{article} {where}"


def _instead(value: Any) -> str:
    """What to use in place of a value that is not JSON (the receiving code turns it back)."""
    if isinstance(value, Model):
        return "use its pk instead and fetch the object where it is used"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        kind = type(value).__name__
        return f"use its isoformat() string instead ({kind}.fromisoformat() reads it back)"
    if isinstance(value, datetime.timedelta):
        return "use its total_seconds() instead"
    if isinstance(value, decimal.Decimal):
        return "use str(value) instead (Decimal(text) reads it back exactly)"
    if isinstance(value, (uuid.UUID, PurePath)):
        return "use str(value) instead"
    if isinstance(value, enum.Enum):
        return "use its .value instead"
    if isinstance(value, float):
        return "NaN and infinities have no JSON form: use None or a string instead"
    if isinstance(value, (set, frozenset)):
        return "use a list instead (sorted(value))"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "use text instead (decode it, or base64 for binary data)"
    return "convert it to JSON values first"


def check_text(text: str, *, what: str) -> None:
    """Refuse a NUL character or a lone surrogate (neither is storable in jsonb or text)."""
    if "\x00" in text:
        raise SerializationError(
            f"The {what} contains a NUL character (\\u0000), which PostgreSQL cannot "
            f"store: {_excerpt(text)}."
        )
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SerializationError(
                f"The {what} contains a lone surrogate, which is not valid Unicode: "
                f"{_excerpt(text)}."
            ) from None


def storable(text: str) -> str:
    """`text` with NULs spelled out and lone surrogates replaced, for a message we must store."""
    text = text.replace("\x00", "\\u0000")
    if not text.isascii():
        text = text.encode("utf-8", errors="replace").decode()
    return text


def _excerpt(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "...")


def loads(value: Any) -> Any:
    """Decode a JSON column as the database driver returned it; never raises."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            value = raw.decode()
        except UnicodeDecodeError as exc:
            return Undecodable(raw.decode(errors="replace"), f"not valid UTF-8 ({exc.reason})")
    if isinstance(value, str):
        # The default payload and metadata: skipping the decoder for them
        # takes a quarter off building the records of a bulk enqueue.
        if value == "{}":
            return {}
        try:
            return _decoder.decode(value)
        except RecursionError:
            return Undecodable(value, "nested too deeply to decode")
        except ValueError as exc:
            return Undecodable(value, f"not valid JSON ({exc})")
    # A driver that already decoded jsonb (not Django's default) hands us objects.
    return value


def decodes_text(value: Any) -> Any:
    """A text column read as bytes (see the SQLite dialect) back to str, repaired if need be."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode(errors="replace")
    return value
