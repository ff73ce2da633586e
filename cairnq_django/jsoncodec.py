"""Strict JSON at the protocol boundary: no NaN, no Infinity, no Python objects.

Everything written must read back as the same value in every peer and be
storable in both databases: PostgreSQL's jsonb refuses NUL characters and lone
surrogates, and JSON itself has only string keys. Everything read must never
stop the reader: a row a foreign writer filled with text this decoder refuses
comes back as an `Undecodable`, for the one task to fail, not the statement.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

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
        raise SerializationError(f"The task {what} is not JSON-serializable: {exc}.") from exc
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
        stack.extend((member, depth + 1) for member in members if isinstance(member, _CONTAINERS))


_CONTAINERS = (dict, list, tuple)


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
