"""The protocol store: every CairnQ operation, over a Django database alias.

`get_store(using)` is the application part (application.py): submit, read,
cancel, retry, purge, count. The lease part, for the worker, `testing` and
conformance, is `store.leases.get_leases(using)`.
"""

from .application import ApplicationOperations, get_store

__all__ = ["ApplicationOperations", "get_store"]
