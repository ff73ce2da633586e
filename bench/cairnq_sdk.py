"""The `cairnq` 0.15.1 SDK as a bench peer: a client factory and a worker entry point.

`python -m bench.cairnq_sdk worker --backend B --db D [--concurrency N] [--poll MS]`
serves the no-op handler until SIGTERM.
"""

import argparse
import os

from .benchapp.stamp import stamp


def dsn(backend: str, db: str) -> str:
    """Return the connection string the SDK takes for a bench database."""
    if backend == "postgres":
        return f"postgresql://{os.environ.get('PGUSER', 'root')}@127.0.0.1:5432/{db}"
    return db


def client(backend: str, db: str):
    """Return an unconnected CairnQ client for the bench database."""
    from cairnq import CairnQ

    if backend == "postgres":
        return CairnQ.postgres(dsn(backend, db))
    return CairnQ.sqlite(db)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--backend", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--poll", type=int, default=None)
    args = parser.parse_args()
    from cairnq import Worker

    options = {}
    if args.concurrency is not None:
        options["concurrency"] = args.concurrency
    if args.poll is not None:
        options["poll_interval_ms"] = args.poll
    if args.backend == "postgres":
        worker = Worker.postgres(dsn(args.backend, args.db), **options)
    else:
        worker = Worker.sqlite(args.db, **options)

    @worker.task("noop")
    def noop(ctx, payload):
        stamp((payload or {}).get("seq"))

    worker.serve()


if __name__ == "__main__":
    main()
