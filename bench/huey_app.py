"""Huey as a bench peer, on SQLite (SqliteHuey) or PostgreSQL (SqlHuey over peewee).

`python -m huey.bin.huey_consumer bench.huey_app.huey` serves the no-op handler.
What it gives up against ours: Huey deletes a task's row when a consumer
dequeues it, so a consumer that dies mid-task loses the task.
"""

import os

from .benchapp.stamp import finished, stamp

_backend = os.environ.get("BENCH_BACKEND", "sqlite")
_db = os.environ.get("BENCH_DB", "/tmp/cairnq_bench_huey.sqlite3")

if _backend == "postgres":
    from huey.contrib.sql_huey import SqlHuey

    huey = SqlHuey("bench", database=f"postgresql://{os.environ.get('PGUSER', 'root')}@127.0.0.1:5432/{_db}")
else:
    from huey import SqliteHuey

    huey = SqliteHuey("bench", filename=_db)


@huey.task()
def noop(seq=None):
    stamp(seq)
    finished()
