"""What every CairnQ model admin refuses before it reaches the database, and what they share.

The query string and the object id in a URL are the visitor's, so each admin
accepts only the lookups it offers (a list filter's parameter, a column the
admin links to), never NUL (PostgreSQL refuses it in any text it compares, and
no CairnQ column holds one), and no search term longer than a real one. What
is refused is a 400 (a 404, or the admin's "doesn't exist", for an id), never
a database error.

Every CairnQ admin also reads the queue's database, is read-only, and checks
permissions and posted buttons the same way: GuardedAdmin holds all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from functools import wraps
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _

from ..conf import cairnq_settings


def acceptable_id(object_id: str) -> bool:
    """Whether an (unquoted) object id from a URL may be compared with a column."""
    return "\x00" not in object_id


def refuse_nul(request: HttpRequest) -> None:
    """Refuse (400) a request whose query string or form holds NUL anywhere."""
    for data in (request.GET, request.POST):
        for key, values in data.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                raise BadRequest("The admin's parameters may not contain NUL.")


class GuardedAdmin(admin.ModelAdmin):
    """A read-only ModelAdmin of the queue's database that takes from the URL only what it offers.

    `url_lookups` names the lookups the query string may carry; Django's own
    default would take any lookup on any column (a regex, a JSON `contains`
    the backend cannot run). A subclass that overrides get_object calls
    acceptable_id itself.

    Its rows change only through the store's and flow control's own calls
    (the list's actions, and the buttons and forms that post to post_view
    URLs), so the admin may not add, change or delete one.
    """

    url_lookups: frozenset[str] = frozenset()
    # Longer than anything a substring search looks for: SQLite refuses LIKE
    # patterns past 50,000 bytes, and Django makes each word of a term a
    # LIKE per search field. None for an admin whose search compares exactly.
    max_search_length: int | None = 200

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.url_lookups

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_nul(request)
        limit = self.max_search_length
        if limit is not None and len(request.GET.get(SEARCH_VAR, "")) > limit:
            raise BadRequest(f"A search term may be at most {limit} characters.")
        return super().changelist_view(request, extra_context)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        if not acceptable_id(object_id):
            return None
        return super().get_object(request, object_id, from_field)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Django looks the object up before it checks permission, so a user
        # who may not view the model could tell real ids from made-up ones.
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        return super().history_view(request, object_id, extra_context)

    @property
    def using(self) -> str:
        return cairnq_settings.DATABASE

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(self.using)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Tasks leave only through the purge action, which keeps live tasks; a
        # worker removes its own row, and a gone one is forgotten after an hour.
        return False

    # ---------------------------------------------------------- permissions
    def has_perm(self, request: HttpRequest, codename: str) -> bool:
        """Whether the user holds this app's permission `codename`."""
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def require_view_permission(self, request: HttpRequest) -> None:
        """Refuse (403) a user who may not view this admin's rows.

        The stats, dashboard, progress and schedules pages are not Django's own
        views, so they check what Django's changelist checks before showing anything.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied

    # ------------------------------------------------------------ own pages
    def render_page(
        self, request: HttpRequest, template: str | list[str], context: dict[str, Any]
    ) -> TemplateResponse:
        """One of this admin's own pages: `context` over the site's, with the model's opts and media."""
        request.current_app = self.admin_site.name
        site = self.admin_site.each_context(request)
        return TemplateResponse(
            request, template, {**site, "opts": self.opts, "media": self.media, **context}
        )

    # ------------------------------------------------------ posted buttons
    def post_view(
        self, view: Callable[..., HttpResponse], codename: str
    ) -> Callable[..., HttpResponse]:
        """`view` as the admin URL a button posts to, behind the permission `codename`.

        Checked in this order: staff only (admin_view, with the admin's CSRF
        check), POST only (405), no NUL (400), the permission (403).
        """

        @wraps(view)
        def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method != "POST":
                return HttpResponseNotAllowed(["POST"])
            refuse_nul(request)
            if not self.has_perm(request, codename):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return self.admin_site.admin_view(guarded)

    def posted_action(self, request: HttpRequest, actions: Container[str]) -> str | None:
        """The posted `action` if it is one of `actions`; None, with an error message, if not."""
        action = request.POST.get("action", "")
        if action in actions:
            return action
        self.message_user(request, _("Unknown action."), messages.ERROR)
        return None


class TaskAdminBase(GuardedAdmin):
    """What the task admin's actions and own pages rely on: its list's URL, its permissions.

    TaskAdmin (task_admin.py) is built on this class, and actions.py and views/
    are written against it, so they need not import the admin that imports them.
    """

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
