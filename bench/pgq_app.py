"""PgQueuer as a bench peer: `pgq run bench.pgq_app:main [--batch-size N]`.

Reads PGQUEUER_DSN. What it gives up against ours: a finished job's row is
deleted (a log row is kept instead), and a job is acknowledged in batches
after the handler returns, so a crash re-runs the unacknowledged ones.
"""

import json
import os
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

from .benchapp.stamp import finished, stamp


@asynccontextmanager
async def main():
    conn = await asyncpg.connect(os.environ["PGQUEUER_DSN"])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        seq = json.loads(job.payload).get("seq") if job.payload else None
        stamp(seq)
        finished()

    try:
        yield pgq
    finally:
        await conn.close()


def serve() -> None:
    """`pgq run`'s worker without its CLI, whose log-level option fails under this
    environment's typer (pgqueuer 1.6.0: "'str' object has no attribute 'name'")."""
    import argparse
    import asyncio

    import pgqueuer

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=10)  # `pgq run`'s default
    parser.add_argument("--max-concurrent-tasks", type=int, default=None)
    args = parser.parse_args()
    limit = args.max_concurrent_tasks
    asyncio.run(pgqueuer.run(main, batch_size=args.batch_size, max_concurrent_tasks=limit))


if __name__ == "__main__":
    serve()
