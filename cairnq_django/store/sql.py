"""The statements the store runs as SQL text: what the ORM cannot express.

Each one says why. Everything else the store runs is an ORM QuerySet compiled
by Django (statements.py). docs/database-setup.md lists these with reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# PostgreSQL's advisory transaction lock on a business key, under the same
# hash the peers use, so keyed submits from every language serialize. Django
# has no advisory locks.
LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended(%s::text, 0))"

# Bulk enqueue through COPY FROM STDIN (PostgreSQL): half the cost per row of
# a multi-row INSERT (W1b). Django has no COPY.
COPY_TASKS = (
    "COPY cairnq_tasks (id, name, queue, status, payload, metadata, max_attempts, priority,"
    " run_at_ms, parent_id, root_id, correlation_id, created_at_ms, updated_at_ms) FROM STDIN"
)

# "Now" on its own, for COPY's rows and for Store.clock_ms(): Django cannot
# select an expression without a table.
SELECT_VALUE = "SELECT {expression}"


def copy_rows(copy, specs: Sequence[dict[str, Any]], now: int) -> None:
    """Stream prepared specs through COPY, every row stamped with one clock reading."""
    with copy(COPY_TASKS) as stream:
        write = stream.write_row
        for spec in specs:
            write((
                spec["id"], spec["name"], spec["queue"], "queued", spec["payload"],
                spec["metadata"], spec["max_attempts"], spec["priority"],
                now + spec["delay_ms"], spec["parent_id"], spec["root_id"],
                spec["correlation_id"], now, now,
            ))
