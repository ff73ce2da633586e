"""Listening seats: a few idle workers per queue set hear `cairnq_queued`, the rest stand by.

PostgreSQL signals every session that LISTENs (to any channel) in the
database for every NOTIFY, and each of them reads the notification queue in
a transaction of its own; its client process is then woken if the channel
is one it listens to. So with N idle workers every task cost the server 2N
such transactions (its cairnq_queued and the winner's drained announcement)
and the host N process wakes: with 32 worker processes on 2 cores that CPU
is what delayed pickup. Now the workers of one configuration (the same
queues and handler names: the drained key, drained.py) share a few seats,
CAIRNQ["LISTENERS"] of them, each a session-level advisory lock held by a
listener connection. A seated process LISTENs `cairnq_queued` and the
drained channel; a standby LISTENs nothing at all (so PostgreSQL does not
signal it) and polls at the healthy wakeup's rare interval.

- A worker seeks a seat when it goes idle and gives it up once all its
  slots are taken (after SEAT_RELEASE_GRACE_S, so a worker whose short tasks
  end at once keeps it): a full worker cannot answer a wake.
- A standby tries for a seat when it goes idle and then every SEAT_RETRY_S
  (jittered), so a seat given up, or freed by a holder that died (its
  session ended), is taken again within SEAT_RETRY_S / standbys on average.
  A taker LISTENs before it wakes its claim loop once, so whatever was
  enqueued while nobody listened is claimed then. Meanwhile the other seat
  and every worker's poll cover the queues.
- Seats are only taken while the delivery probe says notifications arrive
  (probe.py): behind a transaction-mode pooler a session lock would stay on a
  server connection that another client gets next.

The seats are this package's own, like the drained channel: a peer SDK's
worker listens as before and is never a standby.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

# The advisory lock space of the seats (two-int form): the limited claim's
# transaction lock uses 1129401421 (store/sql.py), keyed submits the bigint form.
SEAT_LOCK_SPACE = 1129401422
# A full worker keeps its seat this long: a no-op task ends sooner, and a
# seat given up and taken back costs a few statements and a wake.
SEAT_RELEASE_GRACE_S = 0.05
# How often a standby tries for a seat (a vacancy is not announced: a
# standby listens to nothing). With the idle poll this keeps an idle
# standby near 0.4 transactions a second.
SEAT_RETRY_S = 10.0
SEAT_RETRY_JITTER = 0.5


def seat_lock_ids(key: str, seats: int) -> list[int]:
    """The advisory lock ids (signed int4) of `key`'s seats, in the order they are tried."""
    ids = []
    for seat in range(seats):
        digest = hashlib.sha256(f"{key}/{seat}".encode()).digest()
        ids.append(int.from_bytes(digest[:4], "big", signed=True))
    return ids


def take_seat(key: str, seats: int) -> tuple[str, list[int]]:
    """One statement that takes the first free seat of `key` and says which (NULL: none).

    CASE evaluates its branches in order and stops at the first true one, so
    at most one lock is taken; `seats` pairs of parameters (space, id).
    """
    branches = " ".join(
        f"WHEN pg_try_advisory_lock(%s, %s) THEN {seat}" for seat in range(seats)
    )
    params: list[int] = []
    for lock_id in seat_lock_ids(key, seats):
        params += [SEAT_LOCK_SPACE, lock_id]
    return f"SELECT CASE {branches} END", params


def give_up_seat(key: str, seat: int, seats: int) -> tuple[str, list[int]]:
    """The statement that releases seat number `seat` of `key`."""
    return "SELECT pg_advisory_unlock(%s, %s)", [SEAT_LOCK_SPACE, seat_lock_ids(key, seats)[seat]]


@dataclass
class SeatBook:
    """One process's seats and wishes, key by key; the listener thread acts on its plans.

    `seek` and `leave` come from the worker threads (under the wakeup's lock);
    `due_*` and `took`/`gave_up`/`lost_all` from the listener thread.
    """

    rng: random.Random = field(default_factory=random.Random)
    # key -> how many workers of this process want a seat for it now.
    wanting: dict[str, int] = field(default_factory=dict)
    # key -> the seat held (its index), while the listener's session holds it.
    held: dict[str, int] = field(default_factory=dict)
    # key -> when to give the seat up (a full worker's grace running out).
    release_at: dict[str, float] = field(default_factory=dict)
    # key -> when to try for a seat next (0: at once).
    try_at: dict[str, float] = field(default_factory=dict)

    @property
    def in_use(self) -> bool:
        """Whether any worker of this process ever took part (then standbys hear no wakes)."""
        return bool(self.wanting)

    def seek(self, key: str) -> None:
        self.wanting[key] = self.wanting.get(key, 0) + 1
        self.release_at.pop(key, None)
        if key not in self.held:
            self.try_at[key] = 0.0

    def leave(self, key: str, now: float) -> None:
        self.wanting[key] = max(0, self.wanting.get(key, 0) - 1)
        if self.wanting[key] == 0:
            self.try_at.pop(key, None)
            if key in self.held:
                self.release_at[key] = now + SEAT_RELEASE_GRACE_S

    def seeking(self) -> list[str]:
        """Keys some worker wants a seat for and none is held."""
        return [k for k, n in self.wanting.items() if n and k not in self.held]

    def due_tries(self, now: float) -> list[str]:
        return [k for k in self.seeking() if self.try_at.get(k, 0.0) <= now]

    def due_releases(self, now: float) -> list[str]:
        return [k for k, at in self.release_at.items() if at <= now]

    def took(self, key: str, seat: int | None, now: float) -> None:
        if seat is None:
            self.try_at[key] = now + SEAT_RETRY_S * self.rng.uniform(
                1 - SEAT_RETRY_JITTER, 1 + SEAT_RETRY_JITTER
            )
        else:
            self.held[key] = seat
            self.try_at.pop(key, None)

    def gave_up(self, key: str) -> None:
        self.held.pop(key, None)
        self.release_at.pop(key, None)

    def lost_all(self) -> None:
        """The listener's session ended, and its locks with it: every wanted key tries again."""
        self.held.clear()
        self.release_at.clear()
        for key in self.seeking():
            self.try_at[key] = 0.0

    def next_deadline(self) -> float | None:
        """The earliest moment the listener has something to do for the seats."""
        moments = list(self.release_at.values())
        moments += [self.try_at.get(k, 0.0) for k in self.seeking()]
        return min(moments) if moments else None
