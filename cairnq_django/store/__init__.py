"""The protocol store: every CairnQ operation, over a Django database alias."""

from typing import Any

__all__ = ["Store", "get_store"]


def __getattr__(name: str) -> Any:
    # Lazy: models.py imports store.expressions, and base.py imports models.
    if name in __all__:
        from . import base

        return getattr(base, name)
    raise AttributeError(name)
