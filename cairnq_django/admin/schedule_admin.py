"""The admin's schedules page: each schedule, its next and last run, and run now / pause / resume.

The page lists the schedules of settings.CAIRNQ['SCHEDULE'] (merged with their
state rows; a row whose schedule left settings is shown as stopped). The
actions call the same operations as `manage.py cairnq_schedule`, each behind
its own permission (run_schedule, pause_schedule), POST only, and each leaves
an admin log entry.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _

from ..models import ScheduleState
from ..schedules import state
from ..schedules.overview import ScheduleView, find_schedule, schedule_views
from .guarded import GuardedAdmin, refuse_nul

NEXT_SHOWN = 3

# Action -> the permission codename it needs.
ACTIONS = {
    "run": "run_schedule",
    "pause": "pause_schedule",
    "resume": "pause_schedule",
}


def _when(moment: datetime | None) -> str:
    """A time in the schedule's own zone, as the command prints it (not the site's zone)."""
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z") if moment is not None else "-"


@admin.register(ScheduleState)
class ScheduleAdmin(GuardedAdmin):
    """One page, not a model list: the state table alone does not say what is scheduled."""

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self.require_view_permission(request)
        refuse_nul(request)
        if request.method == "POST":
            return self._act(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "POST"])
        rows = [self._row(view) for view in schedule_views(self.using, count=NEXT_SHOWN)]
        return self.render_page(request, "admin/cairnq_django/schedulestate/change_list.html", {
            "title": _("Schedules"),
            "rows": rows,
            "can_run": self.has_perm(request, ACTIONS["run"]),
            "can_pause": self.has_perm(request, ACTIONS["pause"]),
            **(extra_context or {}),
        })

    def _row(self, view: ScheduleView) -> dict[str, Any]:
        row = view.state
        last_url = None
        if row is not None and row.last_task_id:
            try:
                last_url = reverse(
                    "admin:cairnq_django_task_change", args=[quote(row.last_task_id)]
                )
            except NoReverseMatch:
                pass
        return {
            "name": view.name,
            "schedule": view.schedule,
            "paused": view.paused,
            "next": [_when(view.local(ms)) for ms in view.next_ms],
            "last_at": _when(view.local(row.last_enqueued_at_ms)) if row else None,
            "last_task_id": row.last_task_id if row else None,
            "last_url": last_url,
            "last_status": (
                view.last_task.status if view.last_task
                else (_("purged") if row and row.last_task_id else None)
            ),
        }

    def _act(self, request: HttpRequest) -> HttpResponseRedirect:
        action, name = self.posted_action(request, ACTIONS), request.POST.get("schedule", "")
        back = HttpResponseRedirect(request.path)
        # The action first: its permission depends on it.
        if action is None:
            return back
        if not self.has_perm(request, ACTIONS[action]):
            raise PermissionDenied
        try:
            schedule = find_schedule(name)
        except LookupError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return back
        if action == "run":
            task = state.run_now(self.using, schedule)
            text = _("Enqueued %(task)s %(id)s for schedule “%(name)s”.") % {
                "task": schedule.task, "id": task.id, "name": name,
            }
            done = True
        else:
            done = state.set_paused(self.using, name, action == "pause")
            if action == "pause":
                text = _("Paused “%(name)s”.") if done else _("“%(name)s” was already paused.")
            else:
                text = (
                    _("Resumed “%(name)s”; it carries on from now.") if done
                    else _("“%(name)s” was not paused.")
                )
            text = text % {"name": name}
        if done:
            obj = ScheduleState.objects.using(self.using).get(name=name)
            self.log_change(request, obj, [{"changed": {"fields": [action]}}])
        self.message_user(request, text, messages.SUCCESS if done else messages.WARNING)
        return back
