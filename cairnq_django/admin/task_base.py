"""What the task admin's actions and own pages rely on: its database, its list's URL, its permissions.

TaskAdmin (task_admin.py) is built on this class, and actions.py and views/
are written against it, so they need not import the admin that imports them.
"""

from __future__ import annotations

from django.contrib.auth import get_permission_codename
from django.http import HttpRequest
from django.urls import reverse
from django.utils.http import urlencode

from ..conf import cairnq_settings
from .guarded import GuardedAdmin


class TaskAdminBase(GuardedAdmin):
    """The task admin's database alias, changelist URL, and cancel/retry/purge permissions."""

    @property
    def using(self) -> str:
        return cairnq_settings.DATABASE

    def changelist_url(self, **params: str) -> str:
        opts = self.opts
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        return f"{url}?{urlencode(params)}" if params else url

    def _has_task_permission(self, request: HttpRequest, action: str) -> bool:
        codename = get_permission_codename(action, self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has_task_permission(request, "cancel")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has_task_permission(request, "retry")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self._has_task_permission(request, "purge")
