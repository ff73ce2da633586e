"""Task ids: "task_" followed by a 26-character Crockford base32 ULID."""

from __future__ import annotations

import os
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def ulid(ts_ms: int | None = None) -> str:
    """Return a ULID: 48 bits of epoch milliseconds then 80 random bits."""
    if ts_ms is None:
        ts_ms = time.time_ns() // 1_000_000
    value = (ts_ms << 80) | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_task_id() -> str:
    """Return a fresh protocol task id."""
    return "task_" + ulid()


def now_ms() -> int:
    """Return this host's clock in epoch milliseconds (SQLite's time source)."""
    return time.time_ns() // 1_000_000
