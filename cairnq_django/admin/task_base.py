"""What the task admin's actions and own pages rely on: its database, its list's URL, its permissions.

TaskAdmin (task_admin.py) is built on this class, and actions.py and views/
are written against it, so they need not import the admin that imports them.
"""

from __future__ import annotations

from django.http import HttpRequest
from django.urls import reverse
from django.utils.http import urlencode

from .guarded import GuardedAdmin


class TaskAdminBase(GuardedAdmin):
    """The task admin's changelist URL and its cancel/retry/purge permissions."""

    def changelist_url(self, **params: str) -> str:
        opts = self.opts
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        return f"{url}?{urlencode(params)}" if params else url

    # Django's @admin.action(permissions=["cancel"]) asks has_cancel_permission.
    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self.has_perm(request, "cancel_task")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self.has_perm(request, "retry_task")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self.has_perm(request, "purge_task")
