"""The CairnQ conformance runner: shared JSON scenarios replayed against the store."""

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
