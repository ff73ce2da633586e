"""The example project's Tasks framework path, and its own test suite.

A view enqueues the framework task `demo.tasks.deliver_email`, a real
`cairnq_worker --burst` runs it, and a fresh process reads its TaskResult;
then `manage.py test demo` runs the example's tests (cairnq_django.testing).
Same child-process setup as tests/test_example_project.py.
"""

import json
import textwrap

import pytest

from cairnq_django import compat
from tests.test_example_project import database_url, example_env, run  # noqa: F401

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not compat.AVAILABLE, reason="no Tasks framework installed"),
]

POST_THEN_READ = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from django.test.utils import setup_test_environment
    setup_test_environment()
    from django.test import Client
    import cairnq_django
    from demo.tasks import deliver_email

    if sys.argv[1] == "post":
        page = Client().post(
            "/",
            {"to": "reader@example.com", "subject": "Framework", "body": "x", "via": "framework"},
            follow=True,
        )
        [row] = cairnq_django.list_tasks(name="demo.tasks.deliver_email")
        print(json.dumps({"status": page.status_code, "id": row.id}))
    else:
        result = deliver_email.get_result(sys.argv[2])
        print(json.dumps({
            "status": result.status, "value": result.return_value,
            "attempts": result.attempts, "finished": result.finished_at is not None,
        }))
    """
)


def _script(step, env, *args):
    done = run(["-c", POST_THEN_READ, step, *args], env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_view_enqueues_a_framework_task_the_worker_runs(example_env):  # noqa: F811
    run(["manage.py", "migrate", "--noinput"], example_env)
    posted = _script("post", example_env)
    assert posted["status"] == 200

    worker = run(["manage.py", "cairnq_worker", "--burst"], example_env)
    assert "Subject: Framework" in worker.stdout

    assert _script("read", example_env, posted["id"]) == {
        "status": "SUCCESSFUL",
        "value": {"sent": 1, "to": "reader@example.com"},
        "attempts": 1,
        "finished": True,
    }


def test_the_example_projects_own_tests_pass(example_env):  # noqa: F811
    done = run(["manage.py", "test", "demo", "--noinput", "-v", "1"], example_env)
    assert "Ran 7 tests" in done.stderr and "OK" in done.stderr
