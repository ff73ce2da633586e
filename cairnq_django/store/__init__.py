"""The protocol store: every CairnQ operation, over a Django database alias."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # What __getattr__ returns, for type checkers; at run time facade.py loads lazily.
    from .facade import Store, get_store

__all__ = ["Store", "get_store"]


def __getattr__(name: str) -> Any:
    # Lazy: models.py imports store.expressions, and facade.py imports models.
    if name in __all__:
        from . import facade

        return getattr(facade, name)
    raise AttributeError(name)
