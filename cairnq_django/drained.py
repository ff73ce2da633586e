"""The "drained" announcement that keeps a fleet of idle workers from answering one NOTIFY together.

Every `cairnq_queued` notification reaches every listening worker, and each
of them used to run a claim for it: with N idle workers a task cost N claims.
Now a worker that answers a wake and takes everything claimable for its
queues and names says so on a channel of this package's own,
`cairnq_django_drained`, from inside its claim transaction (so it costs no
transaction of its own and is only delivered if the claim committed): the
claim's last statement NOTIFYs when nothing claimable is left for the
worker's queues and names (store/protocol_statements.py, drained_notify_sql). A
worker that lets a recent winner go first (see worker/idle.py) waits a
moment for that announcement and, when it comes, does not claim.

`cairnq_queued` and its payload (the queue name) are the protocol's and stay
as they are: peers in other languages neither send nor read this channel, and
a worker that never hears an announcement simply claims, as before.

The payload is a digest of the sorted queues and handler names, so only
workers with the same configuration stand down for each other: a worker
that serves a name the announcer does not serve still claims. After the
digest comes the announcer's worker id: a worker defers only once it has
heard another worker announce, so a worker alone on its queues (that "lost"
a race only to its own earlier claim) never waits for an announcement nobody
else will send. Heard once, a peer is remembered: forgetting it after a
quiet spell would let the next wake herd the whole fleet again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

DRAINED_CHANNEL = "cairnq_django_drained"


def drained_key(queues: Iterable[str], names: Iterable[str]) -> str:
    """The announcement payload for workers claiming `names` from `queues`."""
    text = json.dumps([sorted(set(queues)), sorted(set(names))], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def announcement(key: str, worker_id: str) -> str:
    """The payload a worker sends: the key its peers compare, then who sent it."""
    return f"{key} {worker_id}"


def parse_announcement(payload: str) -> tuple[str, str]:
    """(key, sender) of a payload; the sender is "" where none was sent."""
    key, _, sender = payload.partition(" ")
    return key, sender
