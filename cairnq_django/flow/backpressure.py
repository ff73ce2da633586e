"""Make enqueue wait for headroom when a queue is at settings.CAIRNQ['MAX_QUEUE_DEPTH']."""

from __future__ import annotations

import time

from django.db import connections

from ..conf import cairnq_settings
from ..errors import QueueFull
from ..store import ApplicationOperations


def wait_for_headroom(store: ApplicationOperations, queue: str) -> None:
    """Return once `queue` has room; raise QueueFull after MAX_QUEUE_WAIT.

    Inside a transaction on the queue's database there is no wait: a full
    queue raises QueueFull at once.
    """
    limit = cairnq_settings.max_queue_depth(queue)
    if limit is None:
        return
    max_wait = cairnq_settings.MAX_QUEUE_WAIT or 0
    if connections[store.using].in_atomic_block:
        # Waiting would hold the caller's transaction open, and on SQLite its
        # write lock, which every worker needs to claim: the queue could only
        # drain once the wait had already failed. Check once instead.
        max_wait = 0
    deadline = time.monotonic() + max_wait / 1000
    pause = 0.05
    while store.queue_depth(queue, limit) <= 0:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise QueueFull(queue, limit, max_wait)
        time.sleep(min(pause, remaining))
        pause = min(pause * 1.5, 0.5)
