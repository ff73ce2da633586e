"""The CairnQ conformance runner: shared JSON scenarios replayed against the store.

runner: loading scenarios, the store ops they call, running their steps.
assertions: `$alias.field` references and the checks on what a step returned.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import (
        ConformanceError,
        ScenarioResult,
        clear_tasks,
        load_scenario,
        load_scenarios,
        run_scenario,
        run_scenarios,
        scenario_files,
    )

__all__ = [
    "ConformanceError",
    "ScenarioResult",
    "clear_tasks",
    "load_scenario",
    "load_scenarios",
    "run_scenario",
    "run_scenarios",
    "scenario_files",
]


def __getattr__(name: str) -> Any:
    # `python -m cairnq_django.conformance` imports this package before
    # __main__ sets Django up, and the runner reaches the models through the
    # store: its names load on first use.
    if name in __all__:
        from . import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
