"""Which TASKS backends are CairnQ's, and the modules their framework tasks live in.

`import_task_modules()` imports every installed app's `tasks` module and the
modules CairnQ backends list in OPTIONS["MODULES"]: the tasks built there
against a CairnQ backend become known (definitions.py). A CairnQ backend is
told by the tasks it builds (its `task_class`), so discovery sits under the
backend that uses it.
"""

from __future__ import annotations

import sys
from importlib import import_module
from types import ModuleType
from typing import Any

from django.apps import apps
from django.conf import settings
from django.utils.module_loading import autodiscover_modules, import_string

from .. import compat
from .definitions import CairnQTask, known_tasks


def cairnq_backend_aliases() -> list[str]:
    """The TASKS aliases whose backend is a CairnQBackend (builds CairnQTasks)."""
    aliases = []
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend_class = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        task_class = getattr(backend_class, "task_class", None)
        if isinstance(task_class, type) and issubclass(task_class, CairnQTask):
            aliases.append(alias)
    return aliases


def backend_queues() -> list[str]:
    """The QUEUES of every CairnQ backend in settings.TASKS, in order, for a worker to serve."""
    queues: list[str] = []
    for alias in cairnq_backend_aliases():
        queues += sorted(compat.task_backends[alias].queues)
    return list(dict.fromkeys(queues))


def import_task_modules() -> list[ModuleType]:
    """Import installed apps' `tasks` modules and the CairnQ backends' OPTIONS["MODULES"]."""
    autodiscover_modules("tasks")
    modules = [
        sys.modules[f"{config.name}.tasks"]
        for config in apps.get_app_configs()
        if f"{config.name}.tasks" in sys.modules
    ]
    for alias in cairnq_backend_aliases():
        backend: Any = compat.task_backends[alias]  # a CairnQBackend (cairnq_backend_aliases)
        modules += [import_module(name) for name in backend.modules]
    return list(dict.fromkeys(modules))


def find_task(name: str) -> Any:
    """The framework task rows named `name` run, or None.

    Looks among the tasks this process has built; imports the discovered
    task modules first if the name is not among them. Never imports `name`
    itself.
    """
    task = known_tasks.get(name)
    if task is None:
        import_task_modules()
        task = known_tasks.get(name)
    return task
