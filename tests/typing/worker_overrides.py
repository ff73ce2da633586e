"""Checked by mypy in scripts/lint, never run: Worker's option keywords are typed.

Each misspelt or mistyped keyword below carries the ignore for the error mypy
must report there; warn_unused_ignores turns a keyword that stopped being an
error (say, `**overrides: Any` again) into a lint failure.
"""

from cairnq_django.worker import Worker, WorkerOptions


def on_error(exc: BaseException, context: dict[str, object]) -> None:
    """A hook of the ErrorHook shape."""


# Every option by its right name and type, and None for "the setting": no error.
WorkerOptions.from_settings(
    queues=["emails"], names=("send",), concurrency=4, lease_ms=None, poll_ms=250,
    max_run_ms=0, shutdown_timeout_ms=None, retry_backoff_base_ms=0, retry_backoff_cap_ms=None,
    burst=False, using="default", scheduler=None, on_error=on_error,
)
Worker(concurrency=2, on_error="project.hooks.report", discover=False)

# Unexpected keyword argument "concurency" for "from_settings" of "WorkerOptions"; did you
# mean "concurrency"?
WorkerOptions.from_settings(concurency=4)  # type: ignore[call-arg]
# Unexpected keyword argument "poll" for "Worker"
Worker(poll=50)  # type: ignore[call-arg]
# Argument "concurrency" to "Worker" has incompatible type "str"; expected "int | None"
Worker(concurrency="4")  # type: ignore[arg-type]
