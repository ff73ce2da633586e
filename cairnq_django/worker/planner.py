"""Claim planning: what a worker serves, which names draw together, and how much each draw asks.

Names registered with a batch size or their own concurrency draw their own
quota; all other names share one draw. The order of draws rotates between
polls so no name starves. Everything here is plain values and functions (no
database, no threads), so the runner's choices can be tested on their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..records import DEFAULT_QUEUE, TaskRecord
from .registry import Registration


@dataclass(frozen=True)
class Source:
    """One draw: the names claimed together and the tasks each call takes."""

    names: tuple[str, ...]
    batch: int
    concurrency: int | None


@dataclass(frozen=True)
class Draw:
    """What one claim asks of one source: `calls` handler calls' worth of tasks."""

    source: Source
    calls: int

    @property
    def limit(self) -> int:
        """How many tasks the draw claims at most."""
        return self.calls * self.source.batch


def select_handlers(
    registered: Mapping[str, Registration], names: Sequence[str] | None
) -> dict[str, Registration]:
    """The handlers to run: all registered ones, or those `names` (ValueError for unknown ones)."""
    if names is None:
        return dict(registered)
    unknown = sorted(set(names) - set(registered))
    if unknown:
        known = ", ".join(sorted(registered)) or "none"
        raise ValueError(
            f"No handler is registered for {', '.join(map(repr, unknown))}; "
            f"registered task names: {known}."
        )
    return {name: registered[name] for name in names}


def served_queues(
    explicit: Sequence[str] | None,
    configured: Sequence[str] | str,
    handlers: Mapping[str, Registration],
    backend_queues: Sequence[str] = (),
) -> list[str]:
    """The queues to claim from: `explicit` ones, else the configured ones plus declared ones.

    Handlers that declare a queue, and the QUEUES of the Tasks framework's
    CairnQ backends, are served without repeating them in settings.
    """
    if explicit:
        return list(dict.fromkeys(explicit))
    if isinstance(configured, str):
        configured = [configured]
    declared = [r.queue for r in handlers.values() if r.queue]
    served = [*configured, *declared, *backend_queues]
    return list(dict.fromkeys(served)) or [DEFAULT_QUEUE]


def build_sources(handlers: Mapping[str, Registration]) -> tuple[Source, ...]:
    """One source per name that draws alone, in name order, then one shared by the rest."""
    sources: list[Source] = []
    shared: list[str] = []
    for name, reg in sorted(handlers.items()):
        if reg.draws_alone:
            sources.append(Source((name,), reg.batch or 1, reg.concurrency))
        else:
            shared.append(name)
    if shared:
        sources.append(Source(tuple(shared), 1, None))
    return tuple(sources)


def free_calls(concurrency: int, running: int, in_flight: int) -> int:
    """How many calls may start now.

    A call frees its slot when its handler returns, not when its completion
    is committed (`running` counts handlers still running, `in_flight` also
    the calls waiting for their completion to be written): the next claim then
    overlaps the settler's write. Calls waiting to be settled are capped at
    `concurrency` too, so a slow database cannot make the worker hoard claimed tasks.
    """
    return min(concurrency - running, 2 * concurrency - in_flight)


class Rotation:
    """The sources in a new order for every poll: each one starts a poll in turn."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = tuple(sources)
        self._next = 0

    def next_order(self) -> list[Source]:
        if not self.sources:
            return []
        start = self._next % len(self.sources)
        self._next += 1
        return [*self.sources[start:], *self.sources[:start]]


def headroom(source: Source, concurrency: int, calls_by_name: Mapping[str, int]) -> int:
    """How many more calls `source` may run: its own concurrency, else the worker's."""
    if source.concurrency is None:
        return concurrency
    return source.concurrency - calls_by_name.get(source.names[0], 0)


def plan_draws(
    pending: Sequence[Source],
    free: int,
    *,
    concurrency: int,
    calls_by_name: Mapping[str, int],
) -> list[Draw]:
    """The draws of one claim: `free` calls handed out to `pending` in its order."""
    draws: list[Draw] = []
    left = free
    for source in pending:
        quota = min(left, headroom(source, concurrency, calls_by_name))
        if quota <= 0:
            continue
        draws.append(Draw(source, quota))
        left -= quota
    return draws


def any_draw_filled(draws: Sequence[Draw], rows: Sequence[TaskRecord]) -> bool:
    """Whether some draw got its whole quota, and so may have left more work behind.

    A draw that got less emptied its names' share of the queue.
    """
    return any(
        sum(row.name in draw.source.names for row in rows) >= draw.limit for draw in draws
    )


def split_calls(
    rows: Sequence[TaskRecord], handlers: Mapping[str, Registration]
) -> list[tuple[Registration, list[TaskRecord]]]:
    """Group claimed rows into handler calls: one task each, or up to a name's batch size."""
    by_name: dict[str, list[TaskRecord]] = {}
    for row in rows:
        by_name.setdefault(row.name, []).append(row)
    calls: list[tuple[Registration, list[TaskRecord]]] = []
    for name, tasks in by_name.items():
        reg = handlers[name]
        size = reg.batch or 1
        for i in range(0, len(tasks), size):
            calls.append((reg, tasks[i : i + size]))
    return calls
