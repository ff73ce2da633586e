"""Wake sleepers early when the queue changes: LISTEN on PostgreSQL, a watched file on SQLite.

A wake is only ever a hint. Workers and wait() poll the database anyway; a
wake shortens the sleep between two polls and nothing else, so every failure
(no psycopg, a dropped connection, a locked file) degrades to a plain sleep
for the requested time.

    base.py      the Wakeup interface, itself the plain-sleep null object
    postgres.py  LISTEN cairnq_queued / cairnq_done
    sqlite.py    PRAGMA data_version as a change counter, plus an inotify watch
    registry.py  get_wakeup(alias): one per process and alias
"""

from .base import Wakeup
from .postgres import PostgresWakeup
from .registry import build_wakeup, close_all, get_wakeup, use_wakeup
from .sqlite import FileWatch, SQLiteWakeup

__all__ = [
    "FileWatch",
    "PostgresWakeup",
    "SQLiteWakeup",
    "Wakeup",
    "build_wakeup",
    "close_all",
    "get_wakeup",
    "use_wakeup",
]
