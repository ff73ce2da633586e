"""The CairnQ admin: the tasks, workers, schedules and queue-state pages.

Django's admin autodiscovery imports this package, and importing it registers
TaskAdmin (task_admin.py), WorkerAdmin (views/workers.py), ScheduleAdmin
(schedule_admin.py), QueueStateAdmin (queue_state_admin.py) and
FlowLimitAdmin (flow_limit_admin.py) and WorkflowAdmin (workflow_admin.py). The other
modules: guarded.py (GuardedAdmin, the base of them all, and TaskAdminBase,
what the actions and views rely on), changelist.py (paging and sorting the list),
filters.py, actions.py (cancel, retry, purge), task_fields.py (the task page's
fields), display.py (times, raw JSON), and views/ (the stats, dashboard and
task-page views). Nothing outside the admin imports it: durations and
progress are spelled in humanize.py. The SQL the admin needs is in
store/admin_reads.py.
"""

from __future__ import annotations

from django.apps import apps

# A project without django.contrib.admin has no admin site (nor LogEntry) to
# register with; importing the package there registers nothing.
if apps.is_installed("django.contrib.admin"):
    from .flow_limit_admin import FlowLimitAdmin
    from .queue_state_admin import QueueStateAdmin
    from .schedule_admin import ScheduleAdmin
    from .task_admin import TaskAdmin
    from .views.workers import WorkerAdmin
    from .workflow_admin import WorkflowAdmin

    __all__ = [
        "FlowLimitAdmin", "QueueStateAdmin", "ScheduleAdmin", "TaskAdmin", "WorkerAdmin", "WorkflowAdmin",
    ]
