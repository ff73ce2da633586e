"""The admin's pause and resume buttons (on the dashboard) and the queue states' list.

The buttons post to QueueStateAdmin's `pause/` URL, which calls the same
pause_queue / resume_queue as `manage.py cairnq_queue`, behind the
pause_queue permission, POST only (the admin's CSRF check applies), and
leaves an admin log entry on the queue's state row. The list is read-only:
who paused or resumed which queue, and when.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..flow.pausing import pause_queue, resume_queue
from ..models import QueueState
from .display import compact_time, time_field
from .guarded import GuardedAdmin

ACTIONS = ("pause", "resume")


@admin.register(QueueState)
class QueueStateAdmin(GuardedAdmin):
    list_display = ("queue", "paused", "changed", "changed_by")
    list_filter = ("paused",)
    url_lookups = frozenset({"paused__exact"})

    changed = time_field("changed_at_ms", gettext_lazy("changed"), compact_time, "changed_at_ms")

    def get_urls(self) -> list[URLPattern]:
        act = self.post_view(self.pause_view, "pause_queue")
        return [path("pause/", act, name="cairnq_django_queuestate_pause"), *super().get_urls()]

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """Pause or resume the posted queue, then go back to the dashboard."""
        back = HttpResponseRedirect(reverse("admin:cairnq_django_task_dashboard"))
        action, queue = self.posted_action(request, ACTIONS), request.POST.get("queue", "")
        if action is None:
            return back
        by = request.user.get_username()
        try:
            if action == "pause":
                done = pause_queue(queue, using=self.using, by=by)
                text = _("Paused queue “%(queue)s”: no worker claims from it until it is resumed.") \
                    if done else _("Queue “%(queue)s” was already paused.")
            else:
                done = resume_queue(queue, using=self.using, by=by)
                text = _("Resumed queue “%(queue)s”.") if done \
                    else _("Queue “%(queue)s” was not paused.")
        except ValueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return back
        if done:
            state = QueueState.objects.using(self.using).get(queue=queue)
            self.log_change(request, state, [{"changed": {"fields": [action]}}])
        self.message_user(
            request, text % {"queue": queue}, messages.SUCCESS if done else messages.WARNING
        )
        return back
