"""The claim under fleet-wide flow limits (concurrency and rate).

Used only while some limit is in force (flow/limits.py): with none, the
worker claims through leases.py's claim as before, statement for statement.

Exactness comes from serializing: every limited claim of the fleet runs its
counting and its claim in one transaction that holds one lock, PostgreSQL's
advisory transaction lock LIMITED_CLAIM_LOCK (store/sql.py), SQLite's BEGIN
IMMEDIATE write lock. Read committed gives each statement after the lock a
fresh snapshot, so a claim sees every earlier limited claim's tasks as
running and its starts in the log. What runs is counted from the task rows
themselves (status running under an unexpired lease), not from a counter
the claim would have to keep in step (limit_counts.py): a worker killed
mid-task holds its slots until its lease expires, and then the same
transaction's recovery requeues the task and the count drops. Nothing can leak.

Rate limits keep a sliding-window log (models.FlowStart): one row per start
per rate-limited scope (for a key_prefix limit, per concrete key), and a
claim at time t starts a task only if fewer than `rate` starts lie in
(t - per, t]. Then no window of length `per`, wherever it falls, holds more
than `rate` starts; a token bucket of the same rate would let 2 x rate start
across a window boundary (a full bucket spent just before it, refilled just
after).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import QuerySet

from ..models import FlowStart
from ..records import Limit, TaskRecord
from . import sql
from .executor import Executor
from .limit_counts import SCOPE_COLUMNS, Counts, read_counts, scope_value
from .protocol_statements import CLAIM_IDS, Draw, drained_notify_sql, paused_queues_of, tasks_of

if TYPE_CHECKING:
    from .application import ApplicationOperations

# How many candidates one read of the claim looks at: enough that tasks held
# back by a limit do not hide the ones behind them, bounded so a claim never
# reads a whole backlog. A round that finds a scope full excludes it from the
# next read, up to _ROUNDS reads per claim.
_WINDOW_MIN = 100
_WINDOW_PER_SLOT = 4
_ROUNDS = 4
# How often (per process and alias) a limited claim prunes the start log.
_PRUNE_EVERY_S = 10.0
# Starts no limit in force counts (its limit was removed, or is not known
# here yet: workers re-read the limits about once a second) are kept this
# long, or the longest period in force if that is longer.
_KEEP_UNCLAIMED_MS = 24 * 3600 * 1000


@dataclass
class LimitedClaim:
    """What a limited claim took, and what the limits held back."""

    tasks: list[TaskRecord]
    # Due candidates a limit held back (a lower bound: only those it read).
    held: int = 0
    # When held back by a rate limit: ms until its window lets one more start.
    retry_in_ms: int | None = None


def relevant_limits(limits: Sequence[Limit], queues: Sequence[str], plan: Sequence[Draw]) -> list[Limit]:
    """The limits a claim from `queues` for the draws' names can meet.

    Every key_prefix limit: any task may carry a concurrency key.
    """
    any_name = any(draw_names is None for draw_names, _ in plan)
    names = {name for draw_names, _ in plan for name in draw_names or ()}
    return [
        limit for limit in limits
        if limit.scope == "key_prefix"
        or (limit.scope == "queue" and limit.value in queues)
        or (limit.scope == "name" and (any_name or limit.value in names))
    ]


def _rated(limits: Sequence[Limit], task: TaskRecord, key: str | None) -> list[tuple[str, str]]:
    """The (scope, value) pairs under which a start of `task` is logged for the rate limits."""
    return sorted({
        (limit.scope, value) for limit in limits if limit.rate is not None
        if (value := scope_value(limit, task.queue, task.name, key)) is not None
    })


@dataclass
class _Quota:
    """One draw of the planner's: its names (None: any) and how many it may still take."""

    names: frozenset[str] | None
    left: int


class _Pick:
    """The greedy choice of one limited claim: candidates in claim order, every limit respected."""

    def __init__(self, limits: Sequence[Limit], counts: Counts, plan: Sequence[Draw]) -> None:
        self.limits = limits
        self.counts = counts
        self.quota = [_Quota(None if names is None else frozenset(names), n) for names, n in plan]
        self.taken: list[str] = []
        self.keys: dict[str, str | None] = {}  # each taken task's concurrency key
        self.held = 0
        self.retry_at: int | None = None
        # Values found full, by scope: the next read leaves them out.
        self.full: dict[str, set[str]] = {scope: set() for scope in SCOPE_COLUMNS}

    @property
    def names_left(self) -> list[str] | None:
        """The names a further read may take (None: any)."""
        names: set[str] = set()
        for draw in self.quota:
            if draw.left > 0:
                if draw.names is None:
                    return None
                names |= draw.names
        return sorted(names)

    @property
    def wants(self) -> int:
        return sum(draw.left for draw in self.quota)

    def _draw(self, name: str) -> _Quota | None:
        for draw in self.quota:
            if draw.left > 0 and (draw.names is None or name in draw.names):
                return draw
        return None

    def _blocked(self, index: int, limit: Limit, value: str) -> bool:
        """Is `value`'s slot or window under `limit` used up (and if so, note it full)?"""
        counts = self.counts
        if counts.room(index, limit, value) > 0:
            return False
        if limit.rate is not None and limit.per_ms is not None:
            if counts.starts.get(index, {}).get(value, 0) >= limit.rate:
                opens = counts.oldest[index].get(value, counts.now) + limit.per_ms
                self.retry_at = opens if self.retry_at is None else min(self.retry_at, opens)
        self.full.get(limit.scope, self.full["key_prefix"]).add(value)
        return True

    def offer(self, task_id: str, queue: str, name: str, key: str | None) -> None:
        draw = self._draw(name)
        if draw is None:
            return  # its draw got its quota; the planner did not ask for more
        applying = [
            (index, limit, value) for index, limit in enumerate(self.limits)
            if (value := scope_value(limit, queue, name, key)) is not None
        ]
        # Every applying limit is checked (not only the first that blocks),
        # so each full scope is left out of the next read.
        blocked = [self._blocked(index, limit, value) for index, limit, value in applying]
        if any(blocked):
            self.held += 1
            return
        draw.left -= 1
        self.taken.append(task_id)
        self.keys[task_id] = key
        counts = self.counts
        counts.add_running(queue, name, key)
        for index, limit, value in applying:
            if limit.rate is not None:
                counts.starts.setdefault(index, {})[value] = counts.starts.get(index, {}).get(value, 0) + 1
                counts.oldest.setdefault(index, {}).setdefault(value, counts.now)
            # Full now: the next read need not bring its tasks back.
            self._blocked(index, limit, value)


# When each alias's limited claims next prune the start log (time.monotonic()).
_prune_at: dict[str, float] = {}


def claim(
    store: ApplicationOperations,
    recover: Callable[[], object],
    limits: Sequence[Limit],
    queues: Sequence[str],
    worker_id: str,
    lease_ms: int,
    plan: Sequence[Draw],
    announce: tuple[str, Sequence[str]] | None,
    in_force: Sequence[Limit],
) -> LimitedClaim:
    """Lock, recover, count, pick, claim and log the starts: one transaction (LeaseOperations.claim_limited).

    `recover` is the lease part's recovery (passed in: the lease part is the
    caller, and this module sits below it). `limits` are those that can apply
    to this claim; `in_force`, every limit in force, tells the pruning of the
    start log what to keep.
    """
    store.verify_protocol()
    window = max(_WINDOW_MIN, _WINDOW_PER_SLOT * sum(n for _, n in plan))
    with store.atomic():
        # The first read leaves nothing out: on PostgreSQL it goes with the
        # lock and the counts, before they are known.
        first = _candidate_query(store.using, queues, _Pick(limits, Counts(0), plan), window)
        # PostgreSQL: the lock, the recovery, the counts and this read in one round trip.
        found = store.engine.lock_recover_count(limits, first)
        first_rows: list[tuple[str, str, str, str | None]] | None = None
        if found is None:
            now = _lock(store)
            recover()
            counts = read_counts(store.using, limits, now)
        else:
            counts, first_rows = found
        now = counts.now
        pick = _Pick(limits, counts, plan)
        for _ in range(_ROUNDS):
            names = pick.names_left
            if pick.wants <= 0 or names == []:
                break
            excluded = sum(map(len, pick.full.values()))
            if first_rows is not None:
                rows, first_rows = first_rows, None
            else:
                rows = list(_candidate_query(store.using, queues, pick, window))
            for task_id, queue, name, key in rows:
                pick.offer(task_id, queue, name, key)
                if pick.wants <= 0:
                    break
            more = sum(map(len, pick.full.values())) != excluded
            # Another read only helps when this one was cut by the window
            # and found a scope (or a draw) full that the next leaves out.
            if len(rows) < window or not (more or pick.names_left != names):
                break
        tasks: list[TaskRecord] = []
        if pick.taken:
            tasks = store.records(
                CLAIM_IDS, {"worker_id": worker_id, "lease_ms": lease_ms}, (len(pick.taken),),
                [{"id": task_id} for task_id in pick.taken],
            )
            # The log records the starts that happened: the claim
            # re-checks each row's status, though the candidates' locks
            # (the database's, on SQLite) leave nothing to change them.
            # One row per task and rate-limited (scope, value): two prefixes
            # matching one key share its rows, as they count the same starts.
            # Logged at the claim's own clock reading (the rows'
            # updated_at_ms, at or after `now`): the log then says exactly
            # when each task started, and counting from `now` stays exact,
            # as no other limited claim runs between the two readings.
            started = [
                FlowStart(scope=scope, value=value, started_at_ms=task.updated_at_ms)
                for task in tasks for scope, value in _rated(limits, task, pick.keys[task.id])
            ]
            if started:
                FlowStart.objects.using(store.using).bulk_create(started)
        _prune(store.using, limits, in_force or limits, now)
        if announce is not None and store.dialect.has_listen_notify:
            store.run_sql(*drained_notify_sql(store.using, queues, *announce))
    retry_in = None if pick.retry_at is None else max(1, pick.retry_at - now)
    return LimitedClaim(tasks, pick.held, retry_in)


def _lock(store: Executor) -> int:
    """Take the fleet's limited-claim lock where the database needs one; now, in epoch ms, after it.

    SQLite's BEGIN IMMEDIATE already holds the database's one write lock.
    The reading must follow the lock, so that every earlier limited claim
    has committed and logged its starts at or before it; the claim's own
    rows are then stamped at or after it.
    """
    if not store.dialect.has_advisory_locks:
        return store.clock_ms()
    with connections[store.using].cursor() as cursor:
        cursor.execute(sql.LIMITED_CLAIM_LOCK)
        return int(cursor.fetchone()[0])

def _candidate_query(using: str, queues: Sequence[str], pick: _Pick, window: int) -> QuerySet[Any, Any]:
    """Due tasks in claim order, less the scopes found full, locked (PostgreSQL) for the claim."""
    rows = tasks_of(using).claimable(list(queues), pick.names_left).exclude(
        queue__in=paused_queues_of(using)
    )
    for scope, column in SCOPE_COLUMNS.items():
        if pick.full[scope]:
            rows = rows.exclude(**{f"{column}__in": sorted(pick.full[scope])})
    if pick.taken:
        rows = rows.exclude(id__in=pick.taken)
    # FOR UPDATE OF the task rows only: the flow row is on the nullable side of a join.
    locked = rows.values_list("id", "queue", "name", "flow__concurrency_key")[:window]
    return locked.select_for_update(skip_locked=True, of=("self",))

def _prune(using: str, limits: Sequence[Limit], in_force: Sequence[Limit], now: int) -> None:
    """Now and then, drop the starts no window reaches any more.

    Only this claim's rate limits' rows are pruned to their period (a key
    prefix's to the longest key-prefix period in force: LIKE ignores case
    on SQLite, so a prefix's rows may include another's). Everything else
    is kept a day, or the longest period in force: a limit this worker
    does not know yet must not lose its window.
    """
    if time.monotonic() < _prune_at.get(using, 0.0):
        return
    _prune_at[using] = time.monotonic() + _PRUNE_EVERY_S
    log = FlowStart.objects.using(using)
    periods = [limit.per_ms or 0 for limit in in_force if limit.rate is not None]
    log.filter(started_at_ms__lte=now - max([_KEEP_UNCLAIMED_MS, *periods])).delete()
    prefix_period = max((
        limit.per_ms or 0 for limit in in_force
        if limit.rate is not None and limit.scope == "key_prefix"
    ), default=0)
    for limit in limits:
        if limit.rate is None or limit.per_ms is None:
            continue
        if limit.scope == "key_prefix":
            rows = log.filter(scope="key_prefix", value__startswith=limit.value,
                              started_at_ms__lte=now - max(limit.per_ms, prefix_period))
        else:
            rows = log.filter(scope=limit.scope, value=limit.value, started_at_ms__lte=now - limit.per_ms)
        rows.delete()

