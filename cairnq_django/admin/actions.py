"""Admin actions on tasks: cancel, retry and purge, each through the store.

Each action narrows the selection to the states its operation accepts, calls
the store once per task (so the protocol's rules and the database's triggers
apply, exactly as for a peer), reports what happened in a message, and writes
an admin LogEntry for every task it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ..db.querysets import TaskQuerySet
from ..models import Task
from ..store import get_store
from .guarded import TaskAdminBase

PURGE_SAMPLE = 20


def _log(request: HttpRequest, tasks: Iterable[Any], flag: int, message: str) -> None:
    """Write one LogEntry per task; `tasks` are records or unsaved Tasks (id and name)."""
    rows = [Task(id=task.id, name=task.name) for task in tasks]
    if rows:
        LogEntry.objects.log_actions(
            # The admin lets only logged-in staff reach an action, so the user has a pk.
            user_id=cast(int, request.user.pk), queryset=rows, action_flag=flag,
            change_message=message,
        )


def _ids(queryset: QuerySet[Task], narrow: Callable[[TaskQuerySet], TaskQuerySet]) -> list[str]:
    """The ids of the selected tasks that `narrow`, a TaskQuerySet verb, keeps."""
    # The selection is Task.objects' own TaskQuerySet; Django's types promise a QuerySet.
    return list(narrow(cast(TaskQuerySet, queryset)).values_list("id", flat=True))


def _report_skipped(
    modeladmin: TaskAdminBase, request: HttpRequest, skipped: int, why: str
) -> None:
    if skipped:
        modeladmin.message_user(request, why % {"count": skipped}, messages.WARNING)


@admin.action(permissions=["cancel"], description=gettext_lazy("Cancel selected tasks"))
def cancel_tasks(modeladmin: TaskAdminBase, request: HttpRequest, queryset: QuerySet[Task]) -> None:
    """Cancel queued tasks and ask running ones to stop."""
    store = get_store(modeladmin.using)
    selected = queryset.count()
    canceled: list[Any] = []
    requested: list[Any] = []
    for task_id in _ids(queryset, TaskQuerySet.live):
        task = store.cancel(task_id)
        if task is None:
            continue  # finished meanwhile
        (canceled if task.status == "canceled" else requested).append(task)
    _log(request, canceled, CHANGE, _("Canceled."))
    _log(request, requested, CHANGE, _("Cancel requested."))
    if canceled:
        modeladmin.message_user(
            request,
            ngettext("Canceled %(count)d queued task.", "Canceled %(count)d queued tasks.",
                     len(canceled)) % {"count": len(canceled)},
            messages.SUCCESS,
        )
    if requested:
        modeladmin.message_user(
            request,
            ngettext(
                "Asked %(count)d running task to stop; it ends canceled when its worker notices.",
                "Asked %(count)d running tasks to stop; they end canceled when their workers "
                "notice.",
                len(requested),
            ) % {"count": len(requested)},
            messages.SUCCESS,
        )
    _report_skipped(
        modeladmin, request, selected - len(canceled) - len(requested),
        ngettext(
            "%(count)d selected task had already finished and was left alone.",
            "%(count)d selected tasks had already finished and were left alone.",
            selected - len(canceled) - len(requested),
        ),
    )


def _retry(
    modeladmin: TaskAdminBase, request: HttpRequest, queryset: QuerySet[Task], *, reset_attempt: bool
) -> None:
    store = get_store(modeladmin.using)
    selected = queryset.count()
    retried: list[Any] = []
    for task_id in _ids(queryset, TaskQuerySet.retryable):
        task = store.retry(task_id, reset_attempt=reset_attempt)
        if task is not None:
            retried.append(task)
    if reset_attempt:
        _log(request, retried, CHANGE, _("Retried with attempts reset."))
        text = ngettext(
            "Queued %(count)d task again with its attempts reset.",
            "Queued %(count)d tasks again with their attempts reset.",
            len(retried),
        )
    else:
        _log(request, retried, CHANGE, _("Retried."))
        text = ngettext(
            "Queued %(count)d task again.", "Queued %(count)d tasks again.", len(retried)
        )
    if retried:
        modeladmin.message_user(request, text % {"count": len(retried)}, messages.SUCCESS)
    skipped = selected - len(retried)
    _report_skipped(
        modeladmin, request, skipped,
        ngettext(
            "%(count)d selected task was not failed or canceled and was left alone.",
            "%(count)d selected tasks were not failed or canceled and were left alone.",
            skipped,
        ),
    )


@admin.action(
    permissions=["retry"], description=gettext_lazy("Retry selected failed or canceled tasks")
)
def retry_tasks(modeladmin: TaskAdminBase, request: HttpRequest, queryset: QuerySet[Task]) -> None:
    """Queue failed and canceled tasks again, keeping their attempt count."""
    _retry(modeladmin, request, queryset, reset_attempt=False)


@admin.action(
    permissions=["retry"],
    description=gettext_lazy("Retry selected failed or canceled tasks, resetting attempts"),
)
def retry_tasks_reset(
    modeladmin: TaskAdminBase, request: HttpRequest, queryset: QuerySet[Task]
) -> None:
    """Queue failed and canceled tasks again with attempt reset to 0."""
    _retry(modeladmin, request, queryset, reset_attempt=True)


@admin.action(permissions=["purge"], description=gettext_lazy("Purge selected finished tasks"))
def purge_tasks(
    modeladmin: TaskAdminBase, request: HttpRequest, queryset: QuerySet[Task]
) -> TemplateResponse | None:
    """Delete the finished tasks of the selection after a confirmation page."""
    # The selection is Task.objects' own TaskQuerySet (see _ids).
    selection = cast(TaskQuerySet, queryset)
    finished = selection.terminal()
    if request.POST.get("post") == "yes":
        rows = list(finished.values_list("id", "name"))
        deleted: set[str] = set(get_store(modeladmin.using).purge_ids([task_id for task_id, name in rows]))
        _log(
            request,
            [Task(id=task_id, name=name) for task_id, name in rows if task_id in deleted],
            DELETION,
            "",
        )
        modeladmin.message_user(
            request,
            ngettext("Purged %(count)d finished task.", "Purged %(count)d finished tasks.",
                     len(deleted)) % {"count": len(deleted)},
            messages.SUCCESS,
        )
        return None

    purgeable = finished.count()
    live = selection.live().count()
    if not purgeable:
        modeladmin.message_user(
            request,
            _("None of the selected tasks has finished; only succeeded, failed or canceled "
              "tasks can be purged."),
            messages.WARNING,
        )
        return None
    opts = modeladmin.opts
    context = {
        "title": _("Purge finished tasks?"),
        "purgeable": purgeable,
        "live": live,
        "sample": list(finished.order_by("-id").values("id", "name", "status")[:PURGE_SAMPLE]),
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across") == "1",
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return modeladmin.render_page(
        request,
        [
            f"admin/{opts.app_label}/{opts.model_name}/purge_confirmation.html",
            f"admin/{opts.app_label}/purge_confirmation.html",
        ],
        context,
    )


ACTIONS = [cancel_tasks, retry_tasks, retry_tasks_reset, purge_tasks]
