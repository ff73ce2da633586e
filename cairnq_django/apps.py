from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CairnQConfig(AppConfig):
    name = "cairnq_django"
    label = "cairnq_django"
    verbose_name = _("CairnQ task queue")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from . import waiting, wakeup

        waiting.set_done_sleeper(wakeup.sleep_until_done, wakeup.asleep_until_done)

        from .conf import cairnq_settings

        if cairnq_settings.OPENTELEMETRY:
            from .observability import tracing

            tracing.connect()
