"""A worker keeps each thread's database connection across tasks (WORKER_CONN_MAX_AGE)."""

from django.db import connections

from cairnq_django import enqueue, get
from cairnq_django.worker.connections import WorkerConnectionPolicy
from tests.workerutil import run_burst


def _sessions(tasks):
    return {get(task.id).result["session"] for task in tasks}


def test_handler_threads_reuse_their_connections_across_tasks(live_store, child_env):
    tasks = [enqueue("tests.connection_identity") for _ in range(8)]
    run_burst(child_env, "--concurrency", "1")
    assert all(get(task.id).status == "succeeded" for task in tasks)
    # Concurrency 1 has two handler threads: one may still wait for its
    # completion to be written while the other runs the next task. Eight
    # tasks on at most two sessions, not one session per task.
    assert len(_sessions(tasks)) <= 2


def test_worker_conn_max_age_none_keeps_djangos_per_task_connections(live_store, child_env):
    tasks = [enqueue("tests.connection_identity") for _ in range(3)]
    run_burst(child_env, "--concurrency", "1", settings={"WORKER_CONN_MAX_AGE": None})
    # CONN_MAX_AGE=0 in the test settings: a fresh session per task.
    assert len(_sessions(tasks)) == 3


def test_policy_leaves_a_chosen_lifetime_and_restores_the_default(settings):
    config = connections.settings["default"]
    config["CONN_MAX_AGE"] = 0
    policy = WorkerConnectionPolicy()
    policy.apply()
    try:
        assert config["CONN_MAX_AGE"] == 300 and config["CONN_HEALTH_CHECKS"] is True
    finally:
        policy.restore()
    assert config["CONN_MAX_AGE"] == 0
    config["CONN_MAX_AGE"] = 30
    policy.apply()
    assert config["CONN_MAX_AGE"] == 30
    policy.restore()
    config["CONN_MAX_AGE"] = 0
