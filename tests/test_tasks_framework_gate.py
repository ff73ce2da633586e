"""Without settings.TASKS the worker and the checks leave the Tasks framework alone.

On Django 5.2 the django-tasks backport's import is a tenth of a worker's
start-up; a project of plain handlers should not pay it. (The test settings
install the admin, which imports the framework's names for its own pages, so
what is watched here is the backend package, which only the worker's and the
checks' framework paths import.) Each case runs in a fresh interpreter, since
this one imported the framework long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
import django
django.setup()
from django.core.management import call_command
from cairnq_django.worker.options import framework_backend_queues
from cairnq_django.worker.registry import autodiscover, registry
call_command("check", verbosity=0)
autodiscover()
print(json.dumps({
    "queues": framework_backend_queues(),
    "names": sorted(registry.names()),
    "backends": "cairnq_django.backends" in sys.modules,
}))
"""


def probe(tmp_path: Path, tasks_line: str) -> dict:
    (tmp_path / "gate_settings.py").write_text(
        textwrap.dedent(
            f"""
            from tests.settings import *  # noqa
            DATABASES = {{"default": {{
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": {str(tmp_path / "db.sqlite3")!r},
                "OPTIONS": {{"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL"}},
            }}}}
            {tasks_line}
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{ROOT}", DJANGO_SETTINGS_MODULE="gate_settings")
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_tasks_setting_leaves_the_framework_unimported(tmp_path):
    seen = probe(tmp_path, "TASKS = {}")
    assert seen["backends"] is False
    assert seen["queues"] == []
    # The plain handlers of the installed apps' tasks modules register as before.
    assert "tests.echo" in seen["names"]


def test_a_cairnq_backend_in_tasks_is_looked_for(tmp_path):
    seen = probe(tmp_path, "")  # the test settings' TASKS: a CairnQ backend
    assert seen["backends"] is True
    assert "tests.echo" in seen["names"]
