"""The task admin's own pages: stats, dashboard, the task page's buttons, and the workers list."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.views import View

if TYPE_CHECKING:
    from ..tasks import TaskAdmin


class TaskAdminView(View):
    """A view TaskAdmin.get_urls serves, bound to it by as_view(model_admin=...)."""

    # as_view() accepts only keywords the class already has, so a default is needed.
    model_admin: TaskAdmin = None  # type: ignore[assignment]
