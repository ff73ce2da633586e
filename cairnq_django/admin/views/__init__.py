"""The task admin's own pages: stats, dashboard, the task page's buttons, and the workers list."""

from __future__ import annotations

from django.views import View

from ..task_base import TaskAdminBase


class TaskAdminView(View):
    """A view TaskAdmin.get_urls serves, bound to it by as_view(model_admin=...)."""

    # as_view() accepts only keywords the class already has, so a default is needed.
    model_admin: TaskAdminBase = None  # type: ignore[assignment]
