"""The statements the store runs as SQL text: what the ORM cannot express.

Each one says why. Everything else the store runs is an ORM QuerySet compiled
by Django (django_private.py). docs/database-setup.md lists these with reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..records import TaskSpec

# PostgreSQL's advisory transaction lock on a business key, under the same
# hash the peers use, so keyed submits from every language serialize. Django
# has no advisory locks.
LOCK_KEY = "SELECT pg_advisory_xact_lock(hashtextextended(%s::text, 0))"

# The claim under flow limits (store/limited_claim.py) holds this for its
# transaction, so the fleet's limited claims count and claim one at a time.
# The two-integer form's keys never meet the one-bigint keys LOCK_KEY takes
# (PostgreSQL keeps the two key spaces apart); 0x43514c4d is "CQLM". It
# answers the database's clock (epoch ms) read once the lock is held, which
# saves the claim a round trip: the subquery (kept apart by OFFSET 0) waits
# for the lock before the outer select reads clock_timestamp(). Django has no
# advisory locks.
LIMITED_CLAIM_LOCK = (
    "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint"
    " FROM (SELECT pg_advisory_xact_lock(1129401421, 1) OFFSET 0) AS locked"
)

# Bulk enqueue through COPY FROM STDIN (PostgreSQL): half the cost per row of
# a multi-row INSERT. Django has no COPY.
COPY_TASKS = (
    "COPY cairnq_tasks (id, name, queue, status, payload, metadata, max_attempts, priority,"
    " run_at_ms, parent_id, root_id, correlation_id, created_at_ms, updated_at_ms) FROM STDIN"
)

# "Now" on its own, for COPY's rows and for Store.clock_ms(): Django cannot
# select an expression without a table.
SELECT_VALUE = "SELECT {expression}"

# The claim transaction's last statement on PostgreSQL: tell the fleet that
# nothing claimable is left for some names (drained.py). {probe} is the
# compiled HAS_CLAIMABLE statement, every value in it a bound parameter;
# Django cannot select from a subquery that is not a model.
DRAINED_NOTIFY = (
    "SELECT pg_notify(%s, %s) FROM ({probe}) AS cairnq_probe (work, expired)"
    " WHERE NOT cairnq_probe.work"
)

# The admin filters' distinct values of an indexed column as a skip-scan: each
# step asks the index for the next value above the last, so a million rows in
# five queues cost five probes instead of a DISTINCT over the table. Django
# has no recursive CTEs. {table} and {column} are quoted model names.
DISTINCT_VALUES = (
    "WITH RECURSIVE v(value, n) AS ("
    " SELECT (SELECT {column} FROM {table} ORDER BY {column} LIMIT 1), 1"
    " UNION ALL"
    " SELECT (SELECT {column} FROM {table} WHERE {column} > v.value"
    " ORDER BY {column} LIMIT 1), v.n + 1 FROM v"
    " WHERE v.value IS NOT NULL AND v.n < %s)"
    " SELECT value FROM v WHERE value IS NOT NULL"
)

# The planner's row count (PostgreSQL), for the admin's paginator: the catalog
# is not a model.
ROW_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass"

# PostgreSQL: the worker's VACUUM of the queue table after enough claims
# (worker/upkeep.py says why). INDEX_CLEANUP ON: left to AUTO, a VACUUM that
# finds dead rows on few heap pages skips the indexes, and the claim index's
# dead entries are what it is run for. SKIP_LOCKED: another worker's VACUUM
# or autovacuum already at it is enough, nobody waits. Django has no VACUUM.
VACUUM_TASKS = "VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) cairnq_tasks"

# Whether this role may VACUUM the queue table (it owns it, or is a
# superuser), and the table's row estimate VACUUM leaves in the catalog.
# The catalog is not a model.
TASKS_UPKEEP = (
    "SELECT pg_has_role(relowner, 'USAGE'), reltuples::bigint FROM pg_class"
    " WHERE oid = 'cairnq_tasks'::regclass"
)

# SQLite's statistics, refreshed by the worker: without them the planner skips
# the lease-recovery index. A pragma has no ORM form.
OPTIMIZE = "PRAGMA optimize"


def copy_rows(
    copy: Callable[[str], AbstractContextManager[Any]], specs: Sequence[TaskSpec], now: int
) -> None:
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


# A heartbeat's commit need not wait for its WAL flush (PostgreSQL): a renewal
# a crash loses is renewed again a third of a lease later. LOCAL ends with the
# transaction, so it is safe behind a pooler. Django sets no per-transaction
# settings.
ASYNC_COMMIT = "SET LOCAL synchronous_commit TO OFF"

# The SQLite wakeup's own sqlite3 connection (not Django's): read only, and
# the change counter it polls, which moves when another connection commits.
# A pragma has no ORM form.
QUERY_ONLY = "PRAGMA query_only = 1"
DATA_VERSION = "PRAGMA data_version"

# The PostgreSQL wakeup's LISTEN on its own psycopg connection, and the NOTIFY
# its delivery probe (and a queue's resume, flow/pausing.py) sends. Django has
# no LISTEN/NOTIFY. {channel} is one of the wakeup's constant channel names.
LISTEN = "LISTEN {channel}"
UNLISTEN = "UNLISTEN {channel}"
NOTIFY = "SELECT pg_notify(%s, %s)"

# The transactions writing cairnq_tasks right now (PostgreSQL), other than
# this session's: a queue's pause waits for them to end (flow/pausing.py). The
# lock catalog has no ORM form.
OPEN_TASK_WRITERS = (
    "SELECT DISTINCT virtualtransaction FROM pg_locks"
    " WHERE relation = 'cairnq_tasks'::regclass AND mode = 'RowExclusiveLock'"
    " AND granted AND pid <> pg_backend_pid()"
)
