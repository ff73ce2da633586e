"""The permission checks the admin's own pages share with Django's."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest


def require_view_permission(model_admin: admin.ModelAdmin[Any], request: HttpRequest) -> None:
    """Refuse (403) a user who may not view the model admin's rows.

    The stats, dashboard, progress and schedules pages are not Django's own
    views, so they check what Django's changelist checks before showing anything.
    """
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
