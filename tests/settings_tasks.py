"""tests.settings plus a framework-task app: the worker processes of the Tasks backend tests."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.tasksapp"]
TASKS = {
    "default": {**TASKS["default"], "OPTIONS": {"MODULES": ["tests.tasksapp.extra_tasks"]}},
}
