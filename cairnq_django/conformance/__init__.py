"""The CairnQ conformance runner: shared JSON scenarios replayed against the store.

runner: loading scenarios, the store ops they call, running their steps.
assertions: `$alias.field` references and the checks on what a step returned.
"""

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
