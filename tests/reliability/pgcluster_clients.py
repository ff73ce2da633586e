"""Client processes for tests/reliability/test_pg_restart.py, run against a throwaway cluster.

    python -m tests.reliability.pgcluster_clients producer OUT STOPFILE MAX_ATTEMPTS MAX_SECONDS
    python -m tests.reliability.pgcluster_clients waiter OUT KEY
    python -m tests.reliability.pgcluster_clients enqueue OUT NAME PAYLOAD_JSON COUNT

Each writes one JSON object per line to OUT and flushes it at once, so the
test can read what happened even if the process dies. The environment
(ThrowawayCluster.child_env) points tests.settings at the cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import traceback


def _setup() -> None:
    import django

    django.setup()


class _Log:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, **record) -> None:
        record.setdefault("t", time.time())
        with self._lock:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()


def producer(out: str, stop_file: str, max_attempts: int, max_seconds: float) -> int:
    """Enqueue tests.record tasks in a loop; record every id returned and every raise.

    Each attempt carries its own correlation_id, so the test can check that
    an enqueue that raised left no row. The connection is persistent (as in
    a web process with CONN_MAX_AGE=None), so the restart cuts a live session
    and not only new connects; like a web request, every attempt starts with
    close_old_connections(), which drops a connection that broke. Nothing
    else here retries.
    """
    _setup()
    from django.db import close_old_connections, connections

    import cairnq_django

    connections["default"].settings_dict["CONN_MAX_AGE"] = None

    log = _Log(out)
    run = f"p{os.getpid()}"
    deadline = time.monotonic() + max_seconds
    for i in range(max_attempts):
        if os.path.exists(stop_file) or time.monotonic() > deadline:
            break
        marker = f"{run}-{i}"
        close_old_connections()
        try:
            task = cairnq_django.enqueue(
                "tests.record", {"i": i}, correlation_id=marker, max_attempts=5
            )
        except Exception as exc:
            log.write(i=i, marker=marker, error=f"{type(exc).__name__}: {exc}".strip())
        else:
            log.write(i=i, marker=marker, id=task.id)
        time.sleep(0.02)
    close_old_connections()
    return 0


def waiter(out: str, key: str) -> int:
    """wait() on a task that runs across the restart, await a key, then call().

    1. enqueue tests.sleep (6 s) and write its id ("enqueued");
    2. meanwhile a thread runs await_task_by_key(KEY) on its own event loop:
       the key points at nothing until step 4;
    3. wait(id) until the sleep task finishes (the test restarts the server
       while it runs);
    4. enqueue tests.echo under KEY, for the thread's wait;
    5. call(tests.echo) and write every result.
    """
    _setup()
    from asgiref.sync import sync_to_async
    from django.db import connections

    import cairnq_django

    log = _Log(out)
    by_key: dict = {}

    async def await_key():
        try:
            done = await cairnq_django.await_task_by_key(key, timeout=240)
            by_key["result"] = done.result
        except Exception as exc:
            by_key["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            await sync_to_async(connections.close_all)()

    try:
        task = cairnq_django.enqueue("tests.sleep", {"seconds": 6}, max_attempts=5)
        log.write(step="enqueued", id=task.id)
        thread = threading.Thread(target=lambda: asyncio.run(await_key()), daemon=True)
        thread.start()
        done = cairnq_django.wait(task.id, timeout=240)
        log.write(step="waited", id=task.id, status=done.status, result=done.result,
                  attempt=done.attempt)
        cairnq_django.enqueue("tests.echo", {"by": "key"}, key=key)
        thread.join(250)
        log.write(step="awaited_key", **by_key)
        result = cairnq_django.call("tests.echo", {"by": "call"}, timeout=240)
        log.write(step="called", result=result)
    except Exception as exc:
        log.write(step="error", error=f"{type(exc).__name__}: {exc}",
                  traceback=traceback.format_exc())
        return 1
    finally:
        connections.close_all()
    return 0


def enqueue(out: str, name: str, payload_json: str, count: int) -> int:
    """Enqueue COUNT tasks at once (after the restart: are both workers serving?)."""
    _setup()
    import cairnq_django

    log = _Log(out)
    payload = json.loads(payload_json)
    tasks = cairnq_django.enqueue_many([(name, payload)] * count)
    for task in tasks:
        log.write(id=task.id)
    return 0


def main(argv: list[str]) -> int:
    role, *args = argv
    if role == "producer":
        return producer(args[0], args[1], int(args[2]), float(args[3]))
    if role == "waiter":
        return waiter(args[0], args[1])
    if role == "enqueue":
        return enqueue(args[0], args[1], args[2], int(args[3]))
    raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
