"""The CairnQ admin: the tasks, workers, schedules and queue-state pages.

Django's admin autodiscovery imports this package, and importing it registers
TaskAdmin (tasks.py), WorkerAdmin (views/workers.py), ScheduleAdmin
(schedules/admin.py) and QueueStateAdmin (flow/admin.py). The other modules:
changelist.py (paging and sorting the list), filters.py, actions.py (cancel,
retry, purge), task_fields.py (the task page's fields), display.py (times,
durations, raw JSON), permissions.py, and views/ (the stats, dashboard and
task-page views). The SQL the admin needs is in store/admin_reads.py.
"""

from __future__ import annotations

from django.apps import apps

# Code outside the admin (cairnq_health, cairnq_status) imports display.py,
# which imports this package first; a project without django.contrib.admin
# must still be able to, and it has no admin site (nor LogEntry) to register with.
if apps.is_installed("django.contrib.admin"):
    from ..flow.admin import QueueStateAdmin
    from ..schedules.admin import ScheduleAdmin
    from .tasks import TaskAdmin
    from .views.workers import WorkerAdmin

    __all__ = ["QueueStateAdmin", "ScheduleAdmin", "TaskAdmin", "WorkerAdmin"]
