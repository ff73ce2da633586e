"""The protocol store: every CairnQ operation, over a Django database alias."""

from .facade import Store, get_store

__all__ = ["Store", "get_store"]
