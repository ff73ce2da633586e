"""`Store`: one alias's CairnQ operations, the application's and the lease holder's, in one object.

The operations live in two parts over one executor: `application`
(application.py: submit, read, cancel, retry, purge, count) and `leases`
(leases.py: claim, renew, report, settle). A Store forwards each public
method to its part, so `get_store(using).submit(...)` and
`store.claim(...)` read as they always did; code that has a part can call it
directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ..conf import cairnq_settings
from .application import ApplicationOperations
from .executor import Executor
from .leases import LeaseOperations

P = ParamSpec("P")
R = TypeVar("R")


class _Forward(Generic[P, R]):
    """A Store attribute that is the same-named method of one of its parts, typed as that method."""

    def __init__(self, part: str, method: Callable[Concatenate[Any, P], R]) -> None:
        self.part = part
        self.name = method.__name__

    @overload
    def __get__(self, store: None, owner: type[Store]) -> _Forward[P, R]: ...

    @overload
    def __get__(self, store: Store, owner: type[Store] | None = None) -> Callable[P, R]: ...

    def __get__(
        self, store: Store | None, owner: type[Store] | None = None
    ) -> _Forward[P, R] | Callable[P, R]:
        if store is None:
            return self
        # Looked up on every call, not cached: testing.py swaps methods of the
        # parts' classes while inline runners are active.
        method: Callable[P, R] = getattr(getattr(store, self.part), self.name)
        return method


class Store:
    """Protocol operations on the CairnQ tables of one database alias."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.executor = Executor(using)
        self.dialect = self.executor.dialect
        self.application = ApplicationOperations(self.executor)
        self.leases = LeaseOperations(self.executor)

    # The executor's own: the alias's Task QuerySet, clock, transactions.
    tasks = _Forward("executor", Executor.tasks)
    clock_ms = _Forward("executor", Executor.clock_ms)
    atomic = _Forward("executor", Executor.atomic)
    refresh_statistics = _Forward("executor", Executor.refresh_statistics)
    vacuum_tasks = _Forward("executor", Executor.vacuum_tasks)

    # Application code, the admin, retention and schedules.
    prepare = _Forward("application", ApplicationOperations.prepare)
    submit = _Forward("application", ApplicationOperations.submit)
    submit_prepared = _Forward("application", ApplicationOperations.submit_prepared)
    submit_many = _Forward("application", ApplicationOperations.submit_many)
    get = _Forward("application", ApplicationOperations.get)
    get_by_key = _Forward("application", ApplicationOperations.get_by_key)
    get_status = _Forward("application", ApplicationOperations.get_status)
    get_status_by_key = _Forward("application", ApplicationOperations.get_status_by_key)
    list = _Forward("application", ApplicationOperations.list)
    stats = _Forward("application", ApplicationOperations.stats)
    queue_depth = _Forward("application", ApplicationOperations.queue_depth)
    cancel = _Forward("application", ApplicationOperations.cancel)
    retry = _Forward("application", ApplicationOperations.retry)
    cancel_by_key = _Forward("application", ApplicationOperations.cancel_by_key)
    retry_by_key = _Forward("application", ApplicationOperations.retry_by_key)
    purge = _Forward("application", ApplicationOperations.purge)
    count_purgeable = _Forward("application", ApplicationOperations.count_purgeable)
    purge_ids = _Forward("application", ApplicationOperations.purge_ids)

    # Only a lease holder: the worker and `testing`.
    has_claimable = _Forward("leases", LeaseOperations.has_claimable)
    probe_idle = _Forward("leases", LeaseOperations.probe_idle)
    claim = _Forward("leases", LeaseOperations.claim)
    claim_limited = _Forward("leases", LeaseOperations.claim_limited)
    heartbeat = _Forward("leases", LeaseOperations.heartbeat)
    heartbeat_batch = _Forward("leases", LeaseOperations.heartbeat_batch)
    progress = _Forward("leases", LeaseOperations.progress)
    replace_metadata = _Forward("leases", LeaseOperations.replace_metadata)
    succeed = _Forward("leases", LeaseOperations.succeed)
    complete = _Forward("leases", LeaseOperations.complete)
    complete_encoded_many = _Forward("leases", LeaseOperations.complete_encoded_many)
    fail = _Forward("leases", LeaseOperations.fail)
    snooze = _Forward("leases", LeaseOperations.snooze)


_stores: dict[str, Store] = {}


def get_store(using: str | None = None) -> Store:
    """Return the store for a database alias (default: settings.CAIRNQ['DATABASE'])."""
    if using is None:
        using = cairnq_settings.DATABASE
    store = _stores.get(using)
    if store is None:
        store = _stores[using] = Store(using)
    return store
