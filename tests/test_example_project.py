"""The example project end to end: its page queues an email, a real worker sends it.

Everything runs in child processes under the example's own settings
(example_project/demo_site/settings.py) against a throwaway DATABASE_URL on
the backend the suite is testing, exactly as `scripts/demo` runs it.
"""

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "example_project"
BACKEND = os.environ.get("CAIRNQ_TEST_DATABASE", "sqlite")

pytestmark = pytest.mark.slow

# Drives the page through Django's test client in a process configured by the
# example's settings; prints one JSON line with what it saw.
BROWSER = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from django.test.utils import setup_test_environment
    setup_test_environment()
    from django.test import Client

    client = Client()
    step = sys.argv[1]
    seen = {}
    if step == "enqueue":
        page = client.get("/")
        seen["get_status"] = page.status_code
        seen["has_form"] = b'name="to"' in page.content
        bad = client.post("/", {"to": "not an address", "subject": "x", "body": "x"})
        seen["bad_status"] = bad.status_code
        page = client.post(
            "/",
            {"to": "reader@example.com", "subject": sys.argv[2], "body": "Sent by the test."},
            follow=True,
        )
        seen["post_status"] = page.status_code
        seen["redirects"] = [url for url, _ in page.redirect_chain]
    seen["page"] = client.get("/").content.decode()
    seen["table"] = client.get("/tasks/").content.decode()
    import cairnq_django
    seen["tasks"] = [
        {"id": t.id, "name": t.name, "status": t.status, "payload": t.payload, "result": t.result}
        for t in cairnq_django.list_tasks()
    ]
    print(json.dumps(seen))
    """
)


@pytest.fixture
def database_url(tmp_path):
    """A fresh, empty database for the example on the backend under test."""
    if BACKEND != "postgres":
        yield f"sqlite:///{tmp_path / 'demo.sqlite3'}"
        return
    import psycopg

    base = os.environ.get("CAIRNQ_PG_TEST_NAME", "test_cairnq_django")
    name = f"{base}_example_{uuid.uuid4().hex[:8]}"
    user = os.environ.get("PGUSER", "root")
    host = os.environ.get("PGHOST", "127.0.0.1")
    port = os.environ.get("PGPORT", "5432")
    admin = f"host={host} port={port} user={user} dbname=postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{user}@{host}:{port}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def example_env(database_url):
    env = dict(os.environ)
    for name in ("CAIRNQ_CHILD_DB_NAME", "CAIRNQ_TEST_DATABASE"):
        env.pop(name, None)
    env["DJANGO_SETTINGS_MODULE"] = "demo_site.settings"
    env["DATABASE_URL"] = database_url
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(args, env, timeout=180):
    """Run a Python command in the example project and fail with its output."""
    done = subprocess.run(
        [sys.executable, *args],
        cwd=EXAMPLE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(args[:2])} exited {done.returncode}\n"
        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    return done


def browse(step, env, *extra):
    done = run(["-c", BROWSER, step, *extra], env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_page_enqueues_and_worker_completes(example_env):
    run(["manage.py", "migrate", "--noinput"], example_env)
    run(["manage.py", "create_demo_admin"], example_env)
    again = run(["manage.py", "create_demo_admin"], example_env)
    assert "already exists" in again.stdout

    subject = f"Demo subject {uuid.uuid4().hex[:6]}"
    before = browse("enqueue", example_env, subject)
    assert before["get_status"] == 200 and before["has_form"]
    assert before["bad_status"] == 200  # the form comes back with its error, nothing queued
    assert before["post_status"] == 200 and before["redirects"] == ["/"]
    [task] = before["tasks"]
    assert task["name"] == "send_email"
    assert task["status"] == "queued"
    assert task["payload"]["to"] == "reader@example.com"
    assert f'data-task-id="{task["id"]}"' in before["page"]
    assert "status-queued" in before["table"]

    worker = run(["manage.py", "cairnq_worker", "--burst"], example_env)
    # The console email backend prints the message from the worker process.
    assert f"Subject: {subject}" in worker.stdout

    after = browse("show", example_env)
    [task_after] = after["tasks"]
    assert task_after["id"] == task["id"]
    assert task_after["status"] == "succeeded"
    assert task_after["result"] == {"sent": 1, "to": "reader@example.com"}
    for html in (after["page"], after["table"]):
        assert f'data-task-id="{task["id"]}"' in html
        assert "status-succeeded" in html
        assert "&quot;sent&quot;: 1" in html
