"""Where handler calls run: threads for sync handlers, one event loop for async ones.

Sync handler threads are long-lived, so each keeps its Django connection
between calls as CONN_MAX_AGE allows (close_old_connections runs around every
call, as around a request; connections.py sets the worker's lifetime), and
closes it when the thread ends. A thread
running a call the worker abandoned cannot be stopped; it is retired instead:
a fresh thread takes its place, and it exits once its handler returns.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from django.db import connections

logger = logging.getLogger("cairnq_django.worker")


class _HandlerThread(threading.Thread):
    def __init__(self, pool: HandlerThreads, index: int) -> None:
        super().__init__(name=f"cairnq-handler-{index}", daemon=True)
        self.pool = pool
        self.retired = False

    def run(self) -> None:
        try:
            while not self.retired:
                job = self.pool.jobs.get()
                if job is None:
                    break
                try:
                    job()
                except BaseException:
                    # Jobs report their own errors; the thread must outlive them.
                    logger.exception("A cairnq handler thread job raised.")
        finally:
            connections.close_all()


class HandlerThreads:
    """A fixed number of handler threads fed from one job queue."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._threads: list[_HandlerThread] = []
        self._count = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._count += 1
            thread = _HandlerThread(self, self._count)
            self._threads.append(thread)
        thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def retire(self, thread: threading.Thread | None) -> None:
        """Let `thread` exit after its current job and start a replacement."""
        if isinstance(thread, _HandlerThread) and thread in self._threads and not thread.retired:
            thread.retired = True
            with self._lock:
                self._threads.remove(thread)
            self._spawn()

    def stop(self, timeout: float = 2.0) -> None:
        """Ask idle threads to exit; busy (abandoned) ones are daemons and die with us."""
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self.jobs.put(None)
        for thread in threads:
            thread.join(timeout)


class EventLoopThread:
    """One asyncio loop on its own thread, plus a thread pool for its database work."""

    def __init__(self, db_threads: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.db_executor = ThreadPoolExecutor(
            max_workers=max(1, db_threads), thread_name_prefix="cairnq-async-db"
        )
        self._thread = threading.Thread(target=self._run, name="cairnq-asyncio", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.set_default_executor(self.db_executor)
        self.loop.run_forever()

    def start(self) -> None:
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 2.0) -> None:
        if self._thread.is_alive():
            # Deliver CancelledError to coroutines still pending (abandoned
            # calls) while the loop runs; stopping first would leave them to
            # die by GeneratorExit at garbage collection, skipping their cleanup.
            drained = asyncio.run_coroutine_threadsafe(self._cancel_pending(timeout), self.loop)
            try:
                drained.result(timeout + 1)
            except Exception:
                logger.warning("Some async handlers did not finish cancelling in %.1f s.", timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
        self.db_executor.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    async def _cancel_pending(timeout: float) -> None:
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout)
