"""The protocol store: every CairnQ operation, over a Django database alias."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What __getattr__ returns, for type checkers; at run time base.py loads lazily.
    from .base import Store, get_store

__all__ = ["Store", "get_store"]


def __getattr__(name: str) -> Any:
    # Lazy: models.py imports store.expressions, and base.py imports models.
    if name in __all__:
        from . import base

        return getattr(base, name)
    raise AttributeError(name)
