"""The dashboard's form to set or clear a runtime flow limit, and the runtime limits' list.

The form posts to FlowLimitAdmin's `set/` URL, which calls the same
set_limit / clear_limit as `manage.py cairnq_queue limit|unlimit`, behind
the change_limits permission, POST only (the admin's CSRF check applies),
and leaves an admin log entry on the limit's row. Every value comes from the
form as text and is checked before anything is written; a bad one is a
message on the dashboard, never an error page. The list is read-only: which
runtime limits exist, who set each and when.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..flow.limits import LIMIT_SCOPES, clear_limit, set_limit
from ..models import FlowLimit
from ..observability.flow import SCOPE_LABELS, limit_text
from ..records import Limit
from ..retention.durations import parse_duration
from .display import compact_time, time_field
from .guarded import GuardedAdmin

ACTIONS = ("set", "clear")
# Longer than any number a limit can hold (a 32-bit count, a period in ms):
# a longer field is refused before int() spends time on it.
MAX_NUMBER_LENGTH = 32


def _count(field: str, text: str) -> int | None:
    """A form's count field: blank is None; anything but a whole number is a ValueError."""
    text = text.strip()
    if not text:
        return None
    if len(text) > MAX_NUMBER_LENGTH or not text.isascii() or not text.isdigit():
        raise ValueError(_("%(field)s must be a whole number, got “%(text)s”.") % {
            "field": field, "text": text[:40]})
    return int(text)


def _period(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if len(text) > MAX_NUMBER_LENGTH:
        raise ValueError(_("per is not a duration."))
    return parse_duration(text)


@admin.register(FlowLimit)
class FlowLimitAdmin(GuardedAdmin):
    list_display = ("scope", "value", "limit", "changed", "changed_by")
    list_filter = ("scope",)
    url_lookups = frozenset({"scope__exact"})

    @admin.display(description=gettext_lazy("limit"))
    def limit(self, row: FlowLimit) -> str:
        limit = Limit(row.scope, row.value, row.concurrency, row.rate, row.per_ms, "runtime")
        if limit.is_lifted:
            return _("none (lifts the settings' limit)")
        return limit_text(limit)

    changed = time_field("changed_at_ms", gettext_lazy("changed"), compact_time, "changed_at_ms")

    def get_urls(self) -> list[URLPattern]:
        act = self.post_view(self.set_view, "change_limits")
        return [path("set/", act, name="cairnq_django_flowlimit_set"), *super().get_urls()]

    def set_view(self, request: HttpRequest) -> HttpResponse:
        """Set or clear the posted runtime limit, then go back to the dashboard."""
        back = HttpResponseRedirect(reverse("admin:cairnq_django_task_dashboard") + "#cq-limits")
        action, scope = self.posted_action(request, ACTIONS), request.POST.get("scope", "")
        value = request.POST.get("value", "")
        if action is None:
            return back
        if scope not in LIMIT_SCOPES:
            self.message_user(request, _("Choose a queue, a task name or a key prefix."),
                              messages.ERROR)
            return back
        by = request.user.get_username()
        what = {"what": SCOPE_LABELS[scope], "value": value}
        rows = FlowLimit.objects.using(self.using)
        try:
            if action == "set":
                concurrency = _count("concurrency", request.POST.get("concurrency", ""))
                rate = _count("rate", request.POST.get("rate", ""))
                if concurrency is None and rate is None:
                    # set_limit would take it as lifting the settings' limit:
                    # not what an empty form means.
                    raise ValueError(_("Give a concurrency, a rate or both."))
                limit = set_limit(
                    scope, value, concurrency=concurrency, rate=rate,
                    per=_period(request.POST.get("per", "")), using=self.using, by=by,
                )
                row = rows.get(scope=scope, value=value)
                text = _("Limited %(what)s “%(value)s” to %(limit)s.") % {
                    **what, "limit": limit_text(limit)}
                self.log_change(request, row, text)
                self.message_user(request, text, messages.SUCCESS)
                return back
            cleared = rows.filter(scope=scope, value=value).first()
            if cleared is not None and clear_limit(scope, value, using=self.using, by=by):
                self._log_clear(request, cleared)
                self.message_user(
                    request, _("Cleared the runtime limit on %(what)s “%(value)s”.") % what,
                    messages.SUCCESS,
                )
            else:
                self.message_user(
                    request, _("There was no runtime limit on %(what)s “%(value)s”.") % what,
                    messages.WARNING,
                )
        except ValueError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        return back

    @staticmethod
    def _log_clear(request: HttpRequest, cleared: FlowLimit) -> None:
        """Log the clear after the delete, so a clear that found nothing logs nothing.

        The entry keeps the row's id and "scope value", as Django's own
        deletion entries do (ModelAdmin.log_deletions wants a queryset, which
        would be empty by now).
        """
        user_id = request.user.pk  # admin_view let only a logged-in staff user in
        if user_id is not None:
            LogEntry.objects.log_actions(
                user_id=user_id, queryset=[cleared], action_flag=DELETION,
                change_message=_("Cleared the runtime limit."),
            )
