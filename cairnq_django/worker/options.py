"""WorkerOptions: everything a Worker is configured with, as one frozen value.

`WorkerOptions.from_settings(**overrides)` reads settings.CAIRNQ and applies
explicit overrides, where None means "use the setting" and a value out of
range is refused (0 is never a silent "use the default"). The cairnq_worker
command builds its worker from the same call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from django.utils.module_loading import import_string

from ..conf import DEFAULTS, cairnq_settings, tasks_setting_in_use
from ..records import DEFAULT_LEASE_MS
from ..validators import check_integer

ErrorHook = Callable[[BaseException, dict[str, Any]], Any]


def _setting(name: str, minimum: int | None = None) -> dict[str, Any]:
    """Field metadata: the CAIRNQ setting a field defaults to, and its integer floor."""
    return {"setting": name, "minimum": minimum}


class WorkerOverrides(TypedDict, total=False):
    """The keywords of `WorkerOptions.from_settings` and `Worker`: a misspelt one fails mypy.

    One key per WorkerOptions field (a test keeps them in step); None means
    the setting, and `on_error` may be a dotted path.
    """

    queues: Iterable[str] | None
    names: Iterable[str] | None
    concurrency: int | None
    lease_ms: int | None
    poll_ms: int | None
    max_run_ms: int | None
    shutdown_timeout_ms: int | None
    retry_backoff_base_ms: int | None
    retry_backoff_cap_ms: int | None
    burst: bool | None
    using: str | None
    scheduler: bool | None
    on_error: ErrorHook | str | None


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a Worker runs. Built directly, every field not given is the library default."""

    #: Queues to claim from; None: CAIRNQ['QUEUES'] plus the queues handlers declare.
    queues: tuple[str, ...] | None = None
    #: Registered names to run; None: every registered handler.
    names: tuple[str, ...] | None = None
    concurrency: int = field(default=DEFAULTS["CONCURRENCY"], metadata=_setting("CONCURRENCY", 1))
    lease_ms: int = field(default=DEFAULT_LEASE_MS, metadata=_setting("LEASE", 1))
    poll_ms: int = field(default=DEFAULTS["POLL_INTERVAL"], metadata=_setting("POLL_INTERVAL", 1))
    #: Wall-clock ceiling per attempt; 0: none.
    max_run_ms: int = field(default=0, metadata=_setting("MAX_RUN", 0))
    shutdown_timeout_ms: int = field(
        default=DEFAULTS["SHUTDOWN_TIMEOUT"], metadata=_setting("SHUTDOWN_TIMEOUT", 0)
    )
    #: Retry backoff; a base of 0 retries at once.
    retry_backoff_base_ms: int = field(
        default=DEFAULTS["RETRY_BACKOFF_BASE"], metadata=_setting("RETRY_BACKOFF_BASE", 0)
    )
    retry_backoff_cap_ms: int = field(
        default=DEFAULTS["RETRY_BACKOFF_CAP"], metadata=_setting("RETRY_BACKOFF_CAP", 0)
    )
    #: Drain what is claimable now, wait for it to finish, then return.
    burst: bool = False
    #: The database alias holding the CairnQ tables.
    using: str = field(default=DEFAULTS["DATABASE"], metadata=_setting("DATABASE"))
    #: Enqueue the occurrences of CAIRNQ['SCHEDULE'] (never in burst mode).
    scheduler: bool = True
    #: Called with (exception, context dict) for every error the worker survives.
    on_error: ErrorHook | None = field(default=None, metadata=_setting("ON_ERROR"))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            minimum = f.metadata.get("minimum")
            if minimum is not None:
                check_integer(f.name, getattr(self, f.name), minimum=minimum)
        if self.queues is not None:
            # No queues given means the configured ones, as on the command line.
            object.__setattr__(self, "queues", _labels("queues", self.queues) or None)
        if self.names is not None:
            object.__setattr__(self, "names", _labels("names", self.names))
        if not isinstance(self.using, str) or not self.using:
            raise ValueError(f"using must be a database alias, got {self.using!r}.")
        if self.on_error is not None and not callable(self.on_error):
            raise ValueError(f"on_error must be callable, got {self.on_error!r}.")

    @classmethod
    def from_settings(cls, **overrides: Unpack[WorkerOverrides]) -> WorkerOptions:
        """The options settings.CAIRNQ describes, with `overrides` (None: the setting) on top.

        `on_error` (and CAIRNQ['ON_ERROR']) may be a dotted path; it is imported here.
        """
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise TypeError(f"Unknown worker option(s): {', '.join(unknown)}.")
        values: dict[str, Any] = {}
        for name, f in known.items():
            value = overrides.get(name)
            setting = f.metadata.get("setting")
            if value is None and setting is not None:
                value = getattr(cairnq_settings, setting)
                if value is None and f.metadata.get("minimum") == 0:
                    value = 0  # an unset MAX_RUN (or backoff) means none
            if value is not None:
                values[name] = value
        if isinstance(values.get("on_error"), str):
            values["on_error"] = import_string(values["on_error"])
        return cls(**values)


def _labels(option: str, values: Iterable[str]) -> tuple[str, ...]:
    """Queue or task names as a tuple, duplicates dropped in order."""
    if isinstance(values, str):
        raise ValueError(f"{option} must be a list of names, not the string {values!r}.")
    labels = tuple(dict.fromkeys(values))
    for label in labels:
        if not isinstance(label, str) or not label:
            raise ValueError(f"{option} must hold non-empty strings, got {label!r}.")
    return labels


def framework_backend_queues() -> list[str]:
    """The QUEUES of settings.TASKS' CairnQ backends; none without the Tasks framework.

    cairnq_django.backends cannot be imported on Django 5.2 without the
    django-tasks backport, and a worker for plain handlers needs neither.
    """
    if not tasks_setting_in_use():
        return []
    from .. import compat

    if not compat.AVAILABLE:
        return []
    from ..backends.discovery import backend_queues

    return backend_queues()
