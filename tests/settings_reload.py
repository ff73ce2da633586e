"""tests.settings plus a framework-task module in a temporary folder (tests/test_worker_reload.py)."""

import os
import sys

from tests.settings import *  # noqa: F403
from tests.settings import TASKS

# The test rewrites this module; the reloading worker must notice.
sys.path.insert(0, os.environ["CAIRNQ_RELOAD_DIR"])
TASKS = {"default": {**TASKS["default"], "OPTIONS": {"MODULES": ["reload_probe"]}}}
