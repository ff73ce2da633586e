"""PostgreSQL: the worker VACUUMs the queue table after enough claims (issue 31).

Why. A claim changes a row's status, a column of every claim index, so the
update cannot be HOT: the row's old version keeps its entry at the head of
the claim index's queued range (oldest run_at first), pointing at a dead
row. The claim's index scan starts at that head every time. It does mark
the entries it passes dead (kill_prior_tuple: no session of ours holds the
xmin horizon back, and the claim's plan is a plain index scan), which spares
the heap visits, but a B-tree removes marked entries from a page only when an
insert needs room on that page, and nothing is ever inserted at the head: new
tasks land at the tail. So the claim walks one more page per ~70 tasks
claimed, until VACUUM deletes the emptied pages; autovacuum comes at most once
a minute (autovacuum_naptime) and is often off. Measured: 95,000 claims after
the last VACUUM, one claim read 1,369 index pages.

What. After every `claims_between` claimed tasks the worker runs
`VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) cairnq_tasks` on a thread and
connection of its own, so the claim loop never waits for it. Its cost is a
pass over every index of the table, so the interval grows with the table's
rows (its row estimate, which each VACUUM refreshes): at least MIN_CLAIMS,
and one claim per ROWS_PER_CLAIM rows. A fleet needs no coordination: each
worker counts its own claims, so the fleet vacuums about once per interval
of its claims together, and SKIP_LOCKED skips a VACUUM already under way (a
peer's or autovacuum's) instead of waiting. A role that may not VACUUM the
table (not its owner) is told once in the log and never tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import connections

from ..store.leases import LeaseOperations

logger = logging.getLogger("cairnq_django.worker")

# Claimed tasks between two VACUUMs, at least: below ~5,000 the dead head is a
# few dozen index pages, cheaper to walk than a pass over all the indexes.
MIN_CLAIMS = 5_000
# One more claim between VACUUMs per this many rows in the table: each VACUUM
# reads every index, so on a table of a million retained rows (W5) one per
# 10,000 claims keeps it under a few percent of the database's time.
ROWS_PER_CLAIM = 100


def claims_between(rows: int) -> int:
    return max(MIN_CLAIMS, rows // ROWS_PER_CLAIM)


class TableUpkeep:
    """Counts the worker's claims and VACUUMs the queue table after enough of them."""

    def __init__(self, store: LeaseOperations, report: Callable[..., None]) -> None:
        self.store = store
        self.report = report
        self.enabled = store.dialect.needs_claim_vacuum
        self.interval = MIN_CLAIMS
        self._claimed = 0
        self._thread: threading.Thread | None = None

    def claimed(self, count: int) -> None:
        """Note `count` claimed tasks; start a VACUUM when enough have been."""
        if not self.enabled or count <= 0:
            return
        self._claimed += count
        if self._claimed < self.interval or self.running:
            return
        self._claimed = 0
        self._thread = threading.Thread(target=self._vacuum, name="cairnq-upkeep", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _vacuum(self) -> None:
        try:
            rows = self.store.vacuum_tasks()
            if rows is None:
                self.enabled = False
                logger.warning(
                    "This database role may not VACUUM cairnq_tasks (it does not own the table): "
                    "the claim slows down between autovacuum's passes. See docs/database-setup.md."
                )
            else:
                self.interval = claims_between(rows)
        except Exception as exc:  # a missed VACUUM costs speed, never correctness
            self.report(exc, phase="upkeep")
        finally:
            connections[self.store.using].close()
