"""Are the CairnQ tables there? Asked when the queue cannot be read, to say why.

A worker started before `migrate` must stop with one line saying what to run,
while one whose database is restarting must keep retrying. Error messages
differ by database and driver, so the answer comes from the database's own
catalog (Django's introspection), never from guessing at an exception: a
table is missing only when the catalog could be read and does not list it.
"""

from __future__ import annotations

from django.apps import apps
from django.db import connections

from .errors import TablesMissing


def required_tables() -> list[str]:
    """Every table of the cairnq_django models, sorted."""
    return sorted(
        model._meta.db_table
        for model in apps.get_app_config("cairnq_django").get_models()
        if model._meta.managed
    )


def missing_tables(using: str) -> list[str]:
    """The required tables database `using` lacks; raises whatever reading its catalog raises."""
    with connections[using].cursor() as cursor:
        present = set(connections[using].introspection.table_names(cursor))
    return [table for table in required_tables() if table not in present]


def known_missing_tables(using: str) -> list[str]:
    """missing_tables(), or [] when the catalog cannot be read now (the database is down)."""
    try:
        return missing_tables(using)
    except Exception:
        # Unreachable, restarting, misconfigured: nothing is known about the
        # tables, and the caller's own error says what went wrong.
        return []


def check_tables(using: str) -> None:
    """Raise TablesMissing when the catalog shows a required table is absent."""
    missing = known_missing_tables(using)
    if missing:
        raise TablesMissing(using, missing)
