"""Celery on the machine's Redis as a bench peer: no result backend, Celery's defaults.

What it gives up against the database queues: Redis here keeps nothing on disk
(`--save "" --appendonly no`), so a restart loses every queued task; with the
default acks on start, a worker killed mid-task loses that task too.
`celery -A bench.celery_app worker` serves the no-op handler.
"""

import os

from celery import Celery

from .benchapp.stamp import finished, stamp

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")

app = Celery("bench", broker=BROKER)
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("BENCH_PREFETCH"):
    app.conf.worker_prefetch_multiplier = int(os.environ["BENCH_PREFETCH"])


@app.task(name="noop")
def noop(seq=None):
    stamp(seq)
    finished()


def flush() -> None:
    """Empty the bench's Redis database: each cell starts from an empty broker."""
    import redis

    redis.Redis.from_url(BROKER).flushdb()
