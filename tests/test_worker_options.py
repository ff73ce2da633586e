"""WorkerOptions: settings plus explicit overrides, one validation, shared by the command."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cairnq_django.records import DEFAULT_LEASE_MS
from cairnq_django.worker import Registry, Worker, WorkerOptions, WorkerOverrides


def on_error(exc, context):
    """A hook the settings name by dotted path."""


def test_built_directly_the_fields_are_the_library_defaults():
    options = WorkerOptions()
    assert options.lease_ms == DEFAULT_LEASE_MS
    assert options.concurrency == 8 and options.max_run_ms == 0
    assert options.queues is None and options.names is None and options.using == "default"


def test_from_settings_reads_the_settings(settings):
    settings.CAIRNQ = {
        "CONCURRENCY": 3, "LEASE": timedelta(seconds=9), "POLL_INTERVAL": 250,
        "MAX_RUN": 60_000, "SHUTDOWN_TIMEOUT": 0, "RETRY_BACKOFF_BASE": None,
        "ON_ERROR": "tests.test_worker_options.on_error",
    }
    options = WorkerOptions.from_settings()
    assert (options.concurrency, options.lease_ms, options.poll_ms) == (3, 9_000, 250)
    assert options.max_run_ms == 60_000 and options.shutdown_timeout_ms == 0
    assert options.retry_backoff_base_ms == 0  # an unset backoff is none
    assert options.on_error is on_error


def test_none_means_the_setting_and_a_value_overrides_it(settings):
    settings.CAIRNQ = {"CONCURRENCY": 3, "MAX_RUN": 60_000}
    options = WorkerOptions.from_settings(concurrency=None, poll_ms=50, max_run_ms=0)
    assert options.concurrency == 3 and options.poll_ms == 50
    assert options.max_run_ms == 0  # 0 turns a configured MAX_RUN off


@pytest.mark.parametrize(
    "override",
    [
        {"concurrency": 0}, {"lease_ms": 0}, {"poll_ms": -5}, {"max_run_ms": -1},
        {"shutdown_timeout_ms": -1}, {"concurrency": True}, {"concurrency": 2.5},
    ],
)
def test_out_of_range_values_are_refused_not_defaulted(override):
    [(name, value)] = override.items()
    with pytest.raises(ValueError, match=f"{name} must be an integer >= "):
        WorkerOptions.from_settings(**override)


def test_a_setting_out_of_range_is_refused_too(settings):
    settings.CAIRNQ = {"CONCURRENCY": 0}
    with pytest.raises(ValueError, match="concurrency must be an integer >= 1, got 0"):
        WorkerOptions.from_settings()


def test_unknown_options_are_a_type_error():
    with pytest.raises(TypeError, match="sweep"):
        WorkerOptions.from_settings(sweep=True)


def test_the_typed_overrides_name_every_option():
    # mypy checks the keywords against WorkerOverrides (tests/typing/worker_overrides.py).
    assert set(WorkerOverrides.__annotations__) == {f.name for f in dataclasses.fields(WorkerOptions)}


def test_queues_and_names_are_tuples_without_duplicates():
    options = WorkerOptions(queues=["a", "b", "a"], names=["x"])
    assert options.queues == ("a", "b") and options.names == ("x",)
    assert WorkerOptions(queues=[]).queues is None  # none given: the configured ones
    with pytest.raises(ValueError, match="not the string"):
        WorkerOptions(queues="emails")


def test_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        WorkerOptions().concurrency = 2  # type: ignore[misc]


def test_a_worker_takes_options_or_overrides_not_both(db):
    options = WorkerOptions.from_settings(queues=["mine"], concurrency=2)
    worker = Worker(options, registry=Registry())
    assert worker.options is options and worker.queues == ["mine"] and worker.concurrency == 2
    assert Worker(registry=Registry(), concurrency=5).options.concurrency == 5
    with pytest.raises(TypeError, match="not both"):
        Worker(options, registry=Registry(), concurrency=5)


@pytest.mark.parametrize(
    "args, named",
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--lease", "zero"], "--lease"),
        (["--poll", "-1"], "--poll"),
        (["--max-run", "-1"], "--max-run"),
        (["--database", "nope"], "--database: 'nope' is not in settings.DATABASES"),
    ],
)
def test_the_command_names_the_option_in_its_error(args, named):
    with pytest.raises(CommandError, match=named):
        call_command("cairnq_worker", "--burst", *args)
