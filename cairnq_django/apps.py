from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate
from django.utils.translation import gettext_lazy as _


class CairnQConfig(AppConfig):
    name = "cairnq_django"
    label = "cairnq_django"
    verbose_name = _("CairnQ task queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)

        post_migrate.connect(_restore_protocol_rows, sender=self)

        from .conf import cairnq_settings

        if cairnq_settings.OPENTELEMETRY:
            from .observability import tracing

            tracing.connect()


def _restore_protocol_rows(sender: AppConfig, using: str, **kwargs: Any) -> None:
    """Put back the meta rows and ledger after a flush (tests' TransactionTestCase).

    `flush` empties every managed table, and without `cairnq_meta` no peer or
    worker process would accept the database; after `migrate` this is a no-op.
    """
    from django.db import connections

    from .schema import ensure_protocol_rows

    if "cairnq_meta" not in connections[using].introspection.table_names():
        return  # migrated to zero, or not migrated on this alias
    ensure_protocol_rows(using)
