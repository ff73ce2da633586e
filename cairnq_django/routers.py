"""Keep the CairnQ tables in the database named by settings.CAIRNQ['DATABASE'].

Add it to settings.DATABASE_ROUTERS when the queue lives in its own database:

    DATABASE_ROUTERS = ["cairnq_django.routers.CairnQRouter"]
    CAIRNQ = {"DATABASE": "queue"}

Reads and writes of the cairnq_django models go to that alias, `migrate`
creates the tables only there, and no other app's tables are created there.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Model

from .conf import cairnq_settings

APP_LABEL = "cairnq_django"


class CairnQRouter:
    """Route the cairnq_django app to the queue's alias and keep everything else out of it."""

    def _is_ours(self, model: type[Model]) -> bool:
        return model._meta.app_label == APP_LABEL

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return cairnq_settings.DATABASE if self._is_ours(model) else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return cairnq_settings.DATABASE if self._is_ours(model) else None

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        # Rows in different databases cannot reference each other.
        if self._is_ours(type(obj1)) and self._is_ours(type(obj2)):
            return True
        if self._is_ours(type(obj1)) or self._is_ours(type(obj2)):
            return cairnq_settings.DATABASE == DEFAULT_DB_ALIAS or None
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        alias = cairnq_settings.DATABASE
        if app_label == APP_LABEL:
            return db == alias
        if db == alias and alias != DEFAULT_DB_ALIAS:
            return False  # the queue's database holds the queue and nothing else
        return None
