"""PostgreSQL's round-trip variants of the claim, the limited claim and the bulk insert.

Each one does what the generic path (leases.py, limited_claim.py,
application.py) does with the same statements, in fewer round trips:

- `claim`: the lease recovery and the claim as one query string;
- `lock_recover_count`: the limited claim's lock, recovery, counts and first
  candidates as one query string;
- `copy_insert`: a large batch through COPY FROM STDIN.

The engine is chosen once per alias (`engine_of`, from the dialect's
has_round_trip_engine); elsewhere it is the `GenericEngine`, whose variants
all answer None. A variant that cannot run here and now (inside a caller's
transaction, with server-side binding, on psycopg2) answers None too: on
None, the caller takes its generic path.
The driver calls themselves are django_private.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import QuerySet

from ..records import Limit, TaskRecord, TaskSpec
from . import attempts, sql
from .django_private import driver_copy, is_client_binding, run_batch, select_sql
from .encoding import LEASE_EXPIRED, inserted_record
from .limit_counts import Counts, add_rows, count_queries
from .protocol_statements import CLAIM, RECOVER, Draw, claim_shape, drained_notify_sql, draw_values
from .timeouts import statement_prefix

if TYPE_CHECKING:
    from .executor import Executor

# A limited claim's candidate: (id, queue, name, concurrency key).
Candidate = tuple[str, str, str, str | None]

# From this many rows a batch goes through COPY; below it, one multi-row
# INSERT costs fewer round trips than COPY's two.
COPY_MIN_ROWS = 200


class PostgresEngine:
    """Several statements in one query string, and COPY: PostgreSQL's round trips saved."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.using = executor.using

    def claim(
        self, queues: Sequence[str], worker_id: str, lease_ms: int, plan: Sequence[Draw],
        announce: tuple[str, Sequence[str]] | None,
    ) -> list[TaskRecord] | None:
        """Recover and claim as one two-statement query, one round trip.

        Postgres runs the statements of one simple-protocol query as a single
        transaction, and the second (the claim) sees what the first (the
        recovery) requeued, so this is the protocol's claim transaction
        without the BEGIN and COMMIT round trips. Only one draw, outside a
        caller's transaction, with client-side binding (Django's default):
        otherwise None, and the claim runs as usual.
        """
        connection = connections[self.using]
        if len(plan) != 1 or connection.in_atomic_block:
            return None
        ((names, limit),) = plan
        values = {
            "worker_id": worker_id, "lease_ms": lease_ms, "lease_error": LEASE_EXPIRED,
            **draw_values(queues, names),
        }
        shape = claim_shape(queues, names, limit)
        self.executor.verify_protocol()
        with connection.cursor() as cursor:
            if not is_client_binding(cursor):
                return None
            recover, recover_params = RECOVER.bind(self.using, values)
            claim, claim_params = CLAIM.bind(self.using, values, shape)
            # Postgres binds positionally (Dialect.binds_by_name), so the lists join.
            text = f"{recover}; {claim}"
            params = [*recover_params, *claim_params]
            if announce is not None:
                # A third statement of the same transaction, seeing the claim's changes.
                notify, notify_params = drained_notify_sql(self.using, queues, *announce)
                text, params = f"{text}; {notify}", [*params, *notify_params]
            prefix = statement_prefix()
            if prefix is not None:  # the worker's statement timeout (timeouts.py)
                text = prefix + text
            # Past the SET LOCAL, if any; the drained NOTIFY's row is not read.
            results = run_batch(cursor, text, params, skip=0 if prefix is None else 1, read=2)
        # The recovery's own rows come back anyway; nearly always none.
        recovered = [TaskRecord.from_sequence(row) for row in results[0]]
        claimed = [TaskRecord.from_sequence(row) for row in results[1]]
        # That query has committed: the lost attempts' rows follow in a
        # transaction of their own (a crash in between leaves them
        # "unrecorded" in the history, the tasks themselves settled right).
        attempts.record_lost_after(self.using, recovered)
        return claimed

    def lock_recover_count(
        self, limits: Sequence[Limit], first: QuerySet[Any, Any]
    ) -> tuple[Counts, list[Candidate]] | None:
        """The limited claim's lock, lease recovery, counts and `first` candidates in one round trip.

        One simple-protocol query of several statements, run in order inside
        the claim's transaction, each with a snapshot of its own taken after
        the lock is held. Their SQL clock is the query's arrival, before any
        wait for the lock: a lease that ran out during the wait still counts
        as running, and the start log is read from a little earlier than
        needed — both err towards holding back, never towards one too many.
        Only client-side binding (Django's default) sends several statements
        at once; otherwise None, and the caller runs them one by one.
        """
        queries = count_queries(self.using, limits, None)
        with connections[self.using].cursor() as cursor:
            if not is_client_binding(cursor):
                return None
            parts = [(sql.LIMITED_CLAIM_LOCK, ()), RECOVER.bind(self.using, {"lease_error": LEASE_EXPIRED})]
            parts += [select_sql(query) for _, query in queries]
            parts.append(select_sql(first))
            # PostgreSQL binds positionally (Dialect.binds_by_name), so the lists join.
            results = run_batch(
                cursor, "; ".join(text for text, _ in parts), [p for _, params in parts for p in params]
            )
        locked, recovered, *counted, candidates = results
        counts = Counts(int(locked[0][0]))
        for (index, _), rows in zip(queries, counted, strict=True):
            add_rows(counts, limits, index, rows)
        # Still inside the claim's transaction: the lost attempts commit with their recovery.
        attempts.record_lost(self.using, [TaskRecord.from_sequence(row) for row in recovered])
        return counts, [(row[0], row[1], row[2], row[3]) for row in candidates]

    def copy_insert(self, specs: Sequence[TaskSpec]) -> list[TaskRecord] | None:
        """A batch of COPY_MIN_ROWS or more inside the caller's transaction, through COPY.

        COPY returns nothing, so the rows' clock is read first (one round trip)
        and written into every row. Outside a transaction, or on psycopg2
        (no COPY API), None: the multi-row INSERT, which commits on its own.
        """
        connection = connections[self.using]
        if len(specs) < COPY_MIN_ROWS or not connection.in_atomic_block:
            return None
        with connection.cursor() as cursor:
            copy = driver_copy(cursor)
            if copy is None:
                return None
            copied_at = self.executor.clock_ms()
            sql.copy_rows(copy, specs, copied_at)
        return [inserted_record(spec, copied_at) for spec in specs]


class GenericEngine:
    """No round-trip variants: each answers None, so every caller runs its statements one by one."""

    def claim(self, *args: object) -> None:
        return None

    def lock_recover_count(self, *args: object) -> None:
        return None

    def copy_insert(self, *args: object) -> None:
        return None


def engine_of(executor: Executor) -> PostgresEngine | GenericEngine:
    """The engine of the executor's alias: the PostgreSQL variants where the dialect has them."""
    return PostgresEngine(executor) if executor.dialect.has_round_trip_engine else GenericEngine()
