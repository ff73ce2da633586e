"""The django-q2 no-op handler (called by dotted path from async_task)."""

from .stamp import finished, stamp


def noop(seq=None):
    stamp(seq)
    finished()
