"""The worker keeps SQLite's planner statistics fresh; PostgreSQL needs no help."""

from django.db import connection

from cairnq_django.worker import Registry, Worker


def test_the_worker_refreshes_statistics_where_the_database_needs_it(live_store):
    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    reg = Registry()
    reg.register("noop", lambda ctx, payload: None)
    live_store.submit("noop", {})
    with connection.execute_wrapper(record):
        Worker(registry=reg, burst=True, concurrency=1).run()
    assert live_store.stats()["default"]["succeeded"] == 1
    refreshed = statements.count("PRAGMA optimize")
    assert refreshed == (1 if live_store.dialect.needs_periodic_analyze else 0)


def test_refreshing_statistics_is_a_no_op_where_the_database_keeps_them(live_store):
    live_store.refresh_statistics()  # raises nothing on either database
