"""The example project's watchable tasks with a real worker: progress, cancel and retry.

The page starts the long task and the flaky one; a `cairnq_worker` runs them;
the page's cancel button stops the long task mid-count, the flaky one
succeeds on its third attempt, and the table shows both. Same child-process
setup as tests/test_example_project.py.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.test_example_project import EXAMPLE_DIR, database_url, example_env, run  # noqa: F401

pytestmark = pytest.mark.slow

WATCH = textwrap.dedent(
    """
    import json, time
    import django
    django.setup()
    from django.test.utils import setup_test_environment
    setup_test_environment()
    from django.test import Client
    import cairnq_django

    client = Client()
    client.post("/start/long/")
    client.post("/start/flaky/")
    [long] = cairnq_django.list_tasks(name="count_slowly")
    [flaky] = cairnq_django.list_tasks(name="flaky_fetch")

    def until(check, what):
        deadline = time.monotonic() + 90
        while not check():
            if time.monotonic() > deadline:
                raise SystemExit(f"Timed out waiting for {what}.")
            time.sleep(0.1)

    until(lambda: (cairnq_django.get(long.id).progress or 0) > 0, "the first progress step")
    seen = {"table_running": client.get("/tasks/").content.decode()}
    client.post(f"/tasks/{long.id}/cancel/")
    until(lambda: cairnq_django.get(long.id).status == "canceled", "the cancel")
    until(lambda: cairnq_django.get(flaky.id).status == "succeeded", "the flaky task")
    seen["long"] = {k: getattr(cairnq_django.get(long.id), k)
                    for k in ("id", "status", "result", "progress", "message")}
    seen["flaky"] = {k: getattr(cairnq_django.get(flaky.id), k)
                     for k in ("id", "status", "attempt", "result")}
    seen["table_done"] = client.get("/tasks/").content.decode()
    print(json.dumps(seen))
    """
)


def test_the_page_shows_progress_cancel_and_retry(example_env):  # noqa: F811
    run(["manage.py", "migrate", "--noinput"], example_env)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "cairnq_worker"], cwd=EXAMPLE_DIR, env=example_env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        done = run(["-c", WATCH], example_env, timeout=180)
    finally:
        worker.terminate()
        worker.wait(60)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    long, flaky = seen["long"], seen["flaky"]
    assert 'max="100"' in seen["table_running"]
    assert f'/tasks/{long["id"]}/cancel/' in seen["table_running"]
    assert long["status"] == "canceled"
    assert long["result"] is None and 0 < long["progress"] < 1  # stopped mid-count
    assert long["message"].startswith("Counted ")
    assert flaky["status"] == "succeeded" and flaky["attempt"] == 3
    assert flaky["result"] == {"fetched_on_attempt": 3}
    assert f'/tasks/{long["id"]}/retry/' in seen["table_done"]
