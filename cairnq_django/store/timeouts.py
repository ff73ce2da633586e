"""A statement timeout for the worker's own statements, sent with each statement.

A worker statement that hangs (on a row lock another session holds, or on a
path the network stopped carrying) holds up the thread behind it: the claim
loop, the heartbeat or the settler. PostgreSQL's statement_timeout ends it,
and the worker's threads retry. The setting travels in the same query string
as the statement it bounds (`SET LOCAL statement_timeout = ...; <statement>`):
one round trip as before (PostgreSQL runs the two as one transaction, or
inside the caller's), and SET LOCAL lasts only until that transaction ends, so it works behind PgBouncer in
transaction mode and never touches the session of the project's own code.

Only threads that opted in (the worker's claim loop, heartbeat and settler)
get it, through a thread-local; a handler's own queries are the project's.
Only with client-side binding (Django's default for psycopg), the one that
can send two statements in one query; otherwise statements run unbounded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def bounded_statements(timeout_ms: int | None) -> Iterator[None]:
    """Bound this thread's store statements by `timeout_ms` (None or 0: unbounded) while inside."""
    previous = getattr(_local, "prefix", None)
    _local.prefix = (
        f"SET LOCAL statement_timeout = {int(timeout_ms)}; " if timeout_ms else None
    )
    try:
        yield
    finally:
        _local.prefix = previous


def statement_prefix() -> str | None:
    """The text to send before this thread's next statement, or None."""
    return getattr(_local, "prefix", None)
