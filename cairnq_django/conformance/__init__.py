"""The CairnQ conformance runner: shared JSON scenarios replayed against the store.

runner: loading scenarios, the store ops they call, running their steps.
assertions: `$alias.field` references and the checks on what a step returned.
Neither reaches the models on import (`python -m cairnq_django.conformance`
imports this package before __main__ sets Django up).
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
