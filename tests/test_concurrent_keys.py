"""Real processes racing on one database: same-key submits and bulk enqueue under contention.

Every child loads Django (or the reference SDK), announces itself with a file,
and waits for a shared "go" file, so all of them submit at the same moment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.db import connection

from . import catalog

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 8

RENDEZVOUS = """
import os, sys, time, pathlib
gate = pathlib.Path(sys.argv[1])
(gate / f"ready-{os.getpid()}").touch()
deadline = time.monotonic() + 120
while not (gate / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("never released")
    time.sleep(0.005)
"""

DJANGO_SUBMIT = """
import json, os, sys
import django
django.setup()
from cairnq_django import AlreadyExists
from cairnq_django.store import get_store
store = get_store()
store.get("task_warmup")  # connect and verify before the race
# Widen the window between reading the key and inserting the task, so that a
# missing key lock shows up as duplicate tasks rather than by luck of timing.
import time
_insert = store._insert
def slow_insert(specs):
    time.sleep(0.05)
    return _insert(specs)
store._insert = slow_insert
if os.environ.get("CAIRNQ_RACE_WITHOUT_KEY_LOCK"):  # only to show the test can fail
    store.lock_key = lambda key: None
""" + RENDEZVOUS + """
try:
    task = store.submit("race.same_key", {"pid": os.getpid()}, key=sys.argv[2], conflict=sys.argv[3])
    print(json.dumps({"id": task.id}))
except AlreadyExists:
    print(json.dumps({"rejected": True}))
"""

SDK_SUBMIT = """
import asyncio, json, os, sys
from cairnq import AlreadyExists, CairnQ
target = os.environ["CAIRNQ_SDK_TARGET"]

async def main():
    client = CairnQ.postgres(target) if "://" in target else CairnQ.sqlite(target)
    await client.connect()
    try:
        exec(RENDEZVOUS, {"sys": sys, "__name__": "rendezvous"})
        try:
            task = await client.submit(
                "race.same_key", {"pid": os.getpid()}, key=sys.argv[2], conflict=sys.argv[3]
            )
            print(json.dumps({"id": task.id}))
        except AlreadyExists:
            print(json.dumps({"rejected": True}))
    finally:
        await client.close()

RENDEZVOUS = %r
asyncio.run(main())
""" % RENDEZVOUS  # noqa: UP031 - the script's own braces stay literal

DJANGO_BULK = """
import os, sys
import django
django.setup()
import cairnq_django
cairnq_django.get("task_warmup")
""" + RENDEZVOUS + """
for i in range(int(sys.argv[2])):
    cairnq_django.enqueue("race.bulk", {"pid": os.getpid(), "i": i})
print("done")
"""


def race(child_env, tmp_path, scripts_and_args):
    """Start one child per (script, args), release them together, return their outputs."""
    gate = tmp_path / "gate"
    gate.mkdir()
    env = dict(child_env)
    name = connection.settings_dict["NAME"]
    env["CAIRNQ_SDK_TARGET"] = name if connection.vendor == "sqlite" else catalog.pg_dsn(name)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), str(gate), *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for script, args in scripts_and_args
    ]
    try:
        deadline = time.monotonic() + 180
        while len(list(gate.glob("ready-*"))) < len(children):
            failed = [c for c in children if c.poll() not in (None, 0)]
            assert not failed, failed[0].communicate()[1][-3000:]
            assert time.monotonic() < deadline, "children never became ready"
            time.sleep(0.05)
        (gate / "go").touch()
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-3000:]
            assert "database is locked" not in err
            outputs.append((out, err))
        return outputs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def rows_named(name):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, status FROM cairnq_tasks WHERE name = %s ORDER BY id", [name]
        )
        return cursor.fetchall()


def answers(outputs):
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


@pytest.mark.parametrize("mix", ["django", "django+sdk"])
def test_same_key_reuse_creates_exactly_one_task(live_store, child_env, tmp_path, mix):
    scripts = [DJANGO_SUBMIT] * PROCESSES
    if mix == "django+sdk":
        # Half of them are the reference peer: the key lock must be the same one.
        scripts = [DJANGO_SUBMIT, SDK_SUBMIT] * (PROCESSES // 2)
    outputs = race(child_env, tmp_path, [(s, ("invoice-42", "reuse")) for s in scripts])
    ids = {answer["id"] for answer in answers(outputs)}
    rows = rows_named("race.same_key")
    assert len(rows) == 1, rows
    assert ids == {rows[0][0]}
    assert live_store.get_by_key("invoice-42").id == rows[0][0]


def test_same_key_reject_admits_exactly_one(live_store, child_env, tmp_path):
    outputs = race(
        child_env, tmp_path, [(DJANGO_SUBMIT, ("once-only", "reject"))] * PROCESSES
    )
    results = answers(outputs)
    winners = [r["id"] for r in results if "id" in r]
    assert len(winners) == 1 and sum("rejected" in r for r in results) == PROCESSES - 1
    assert [row[0] for row in rows_named("race.same_key")] == winners


def test_same_key_replace_leaves_one_live_task(live_store, child_env, tmp_path):
    outputs = race(
        child_env, tmp_path, [(DJANGO_SUBMIT, ("latest", "replace"))] * PROCESSES
    )
    rows = rows_named("race.same_key")
    assert len(rows) == PROCESSES and len({a["id"] for a in answers(outputs)}) == PROCESSES
    live = [task_id for task_id, status in rows if status == "queued"]
    assert len(live) == 1
    assert live_store.get_by_key("latest").id == live[0]


def test_bulk_enqueue_from_many_processes_loses_nothing(live_store, child_env, tmp_path):
    per_child = 200
    outputs = race(child_env, tmp_path, [(DJANGO_BULK, (str(per_child),))] * PROCESSES)
    assert all(out.strip() == "done" for out, _ in outputs)
    assert len(rows_named("race.bulk")) == PROCESSES * per_child
    assert live_store.stats()["default"]["queued"] == PROCESSES * per_child
