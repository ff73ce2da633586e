"""{% cq_breadcrumbs %}: the admin's breadcrumbs in the markup this Django's admin styles.

Our pages (dashboard, queue stats, schedules, purge confirmation) replace the breadcrumbs
block; written by hand, the markup would be one Django version's and render unstyled on
another. This tag is the one place that knows which (cairnq_django.compat).
"""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse
from django.utils.text import capfirst
from django.utils.translation import gettext

from cairnq_django import compat

register = template.Library()


@register.inclusion_tag("admin/cairnq_django/breadcrumbs.html")
def cq_breadcrumbs(opts: Any, current: str, changelist_url: str = "") -> dict[str, Any]:
    """Home › app › (model list, when changelist_url is given) › current page."""
    crumbs = [
        (gettext("Home"), reverse("admin:index")),
        (opts.app_config.verbose_name, reverse("admin:app_list", kwargs={"app_label": opts.app_label})),
    ]
    if changelist_url:
        crumbs.append((capfirst(opts.verbose_name_plural), changelist_url))
    return {"crumbs": crumbs, "current": current, "as_list": compat.ADMIN_BREADCRUMBS_AS_LIST}
