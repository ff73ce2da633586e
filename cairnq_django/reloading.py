"""`cairnq_worker --reload`: restart the worker when the project's code changes.

Django's own autoreloader does the watching, as for `runserver`: a
supervising process starts the worker in a child process and starts it again
whenever the child exits to reload. Unlike `runserver`, both ends stop
gracefully: the supervisor passes SIGTERM, SIGINT and SIGHUP on to the child,
and before the child reloads for a changed file it stops its worker the usual
way, letting running tasks finish for up to the shutdown timeout and
requeueing the rest at once.

The child runs in a process group of its own, so a terminal's Ctrl-C reaches
the supervisor alone and the child sees it once, forwarded: were the child in
the terminal's group as well, it would see each Ctrl-C twice (directly and
forwarded), and a second signal means "exit at once". Whoever stops the
worker signals the supervisor's PID, the one the command started as.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from django.utils import autoreload

logger = logging.getLogger("cairnq_django.worker")

# Extra time, past the worker's own shutdown timeout, a reload waits for it.
_STOP_SLACK_S = 5.0
# What the supervisor passes on to the child. SIGHUP too: the child is out of
# the terminal's process group, so a closing terminal would not reach it.
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_with_reloader(
    build_worker: Callable[[], Any], *, fatal: tuple[type[BaseException], ...] = ()
) -> None:
    """Run the worker `build_worker()` returns, restarting it on code changes.

    An exception in `fatal` raised by the worker's run() is logged in one line
    and ends both processes with exit code 1, instead of waiting for a file
    to change: it says the database needs someone's action, not new code.
    """
    if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true":
        _run_child(build_worker, fatal)
    else:
        sys.exit(_supervise())


def _supervise() -> int:
    """Start the child again each time it exits to reload; return its last exit code."""
    child: subprocess.Popen | None = None
    stopping = False

    def forward(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True  # arriving between two children, it ends the loop
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    args = autoreload.get_child_arguments()
    logger.info(
        "Supervising the reloading worker as pid %d: send SIGTERM or SIGINT to this pid "
        "to stop it.", os.getpid(),
    )
    while True:
        # Its own process group: see the module docstring.
        child = subprocess.Popen(args, env=env, close_fds=False, process_group=0)
        code = child.wait()
        if stopping:  # asked to stop while a child was reloading: it has stopped
            return 0 if code == 3 else code
        if code != 3:  # 3 is the autoreloader's "reload me"
            return code


def _run_child(build_worker: Callable[[], Any], fatal: tuple[type[BaseException], ...]) -> None:
    reloader = autoreload.get_reloader()
    built: list[Any] = []
    failed: list[BaseException] = []

    def on_signal(signum: int, frame: Any) -> None:
        if built:
            built[0].handle_signal(signum, frame)
        else:
            sys.exit(0)

    # Installed here, on the main thread: the worker itself runs on another.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def run() -> None:
        built.append(build_worker())
        try:
            built[0].run()
        except fatal as exc:
            logger.error("%s", exc)
            failed.append(exc)
        reloader.stop()  # stopped by a signal (or fatally): end the child, not just the worker

    # check_errors() remembers the file of an error (a task module that does
    # not import, say), so fixing it reloads even though the worker died.
    thread = threading.Thread(
        target=autoreload.check_errors(run), name="cairnq-worker", daemon=True
    )

    def on_file_changed(sender: Any, file_path: Any, **kwargs: Any) -> None:
        if built and thread.is_alive():
            built[0].stop()
        logger.info("%s changed; stopping the worker to reload.", file_path)
        if built and thread.is_alive():
            thread.join(built[0].shutdown_timeout_ms / 1000 + _STOP_SLACK_S)
        # Returning nothing lets the autoreloader go on and reload.

    autoreload.file_changed.connect(on_file_changed, weak=False)
    logger.info("Watching for file changes with %s", type(reloader).__name__)
    thread.start()
    while not reloader.should_stop:
        reloader.run(thread)
    if failed:
        sys.exit(1)
