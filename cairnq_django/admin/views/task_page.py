"""The task page's Cancel and Retry buttons and its live progress.

The buttons post to small views that check the same permissions as the
list's actions (and view, as the task page itself does) and go through the
store, as the actions do. A running task's page polls the progress view (a
few lines of static JavaScript) and reloads once the task leaves `running`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils.translation import gettext as _

from ...humanize import progress_percent, valid_progress
from ...models import Task
from ...records import LIVE_STATUSES, RETRYABLE_STATUSES
from ...store import get_store
from ...store.admin_reads import task_message
from ..guarded import TaskAdminBase, acceptable_id

PROGRESS_POLL_MS = 1000


def _task_values(model_admin: TaskAdminBase, object_id: str, *fields: str) -> dict[str, Any]:
    """The task's `fields`, or 404; `object_id` is already unquoted."""
    if not acceptable_id(object_id):
        raise Http404
    row: dict[str, Any] | None = (
        Task.objects.using(model_admin.using).filter(pk=object_id).values(*fields).first()
    )
    if row is None:
        raise Http404
    return row


def controls(model_admin: TaskAdminBase, request: HttpRequest, task: Task) -> dict[str, Any]:
    """What the task page offers: the buttons this user may press for this status."""
    status = task.status
    can_cancel = (
        status in LIVE_STATUSES and task.cancel_requested_at_ms is None
        and model_admin.has_cancel_permission(request)
    )
    can_retry = status in RETRYABLE_STATUSES and model_admin.has_retry_permission(request)
    live = status == "running"
    return {
        "cq_can_cancel": can_cancel,
        "cq_can_retry": can_retry,
        "cq_live": live,
        "cq_percent": progress_percent(task.progress),
        "cq_progress_invalid": task.progress is not None and valid_progress(task.progress) is None,
        "cq_message": task_message(model_admin.using, task.pk) if live else None,
        "cq_poll_ms": PROGRESS_POLL_MS,
    }


def _acting_on(
    model_admin: TaskAdminBase, request: HttpRequest, object_id: str, codename: str
) -> str:
    """The unquoted id of the task a button acts on, once the user may (403) and it exists (404)."""
    object_id = unquote(object_id)
    # View first, as every page of a task checks: without it a user could
    # act on ids they cannot see, and tell real ids from made-up ones by the answer.
    model_admin.require_view_permission(request)
    if not model_admin.has_perm(request, codename):
        raise PermissionDenied
    _task_values(model_admin, object_id, "id")
    return object_id


def _log(model_admin: TaskAdminBase, request: HttpRequest, task: Any, message: str) -> None:
    """Log the button's change in the task's history, as Django logs a change."""
    model_admin.log_change(request, Task(id=task.id, name=task.name), message)


def _back_to_task(model_admin: TaskAdminBase, object_id: str) -> HttpResponseRedirect:
    opts = model_admin.opts
    return HttpResponseRedirect(
        reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(object_id)])
    )


def cancel_view(
    model_admin: TaskAdminBase, request: HttpRequest, object_id: str
) -> HttpResponseRedirect:
    object_id = _acting_on(model_admin, request, object_id, "cancel_task")
    task = get_store(model_admin.using).cancel(object_id)
    if task is None:
        messages.warning(request, _("The task had already finished; nothing was canceled."))
    elif task.status == "canceled":
        _log(model_admin, request, task, _("Canceled."))
        messages.success(request, _("Canceled the task."))
    else:
        _log(model_admin, request, task, _("Cancel requested."))
        messages.success(
            request,
            _("Asked the running task to stop; it ends canceled when its worker notices."),
        )
    return _back_to_task(model_admin, object_id)


def retry_view(
    model_admin: TaskAdminBase, request: HttpRequest, object_id: str
) -> HttpResponseRedirect:
    object_id = _acting_on(model_admin, request, object_id, "retry_task")
    reset = request.POST.get("reset_attempt") == "1"
    task = get_store(model_admin.using).retry(object_id, reset_attempt=reset)
    if task is None:
        messages.warning(request, _("Only a failed or canceled task can be retried."))
    elif reset:
        _log(model_admin, request, task, _("Retried with attempts reset."))
        messages.success(request, _("Queued the task again with its attempts reset."))
    else:
        _log(model_admin, request, task, _("Retried."))
        messages.success(request, _("Queued the task again."))
    return _back_to_task(model_admin, object_id)


def progress_view(model_admin: TaskAdminBase, request: HttpRequest, object_id: str) -> JsonResponse:
    """The running task's status, progress and message as JSON, for the live panel."""
    object_id = unquote(object_id)
    model_admin.require_view_permission(request)
    row = _task_values(model_admin, object_id, "status", "progress", "cancel_requested_at_ms")
    progress = valid_progress(row["progress"])
    return JsonResponse(
        {
            "status": row["status"],
            # NaN and Infinity are not JSON: the panel's JSON.parse would refuse the answer.
            "progress": progress,
            "progress_invalid": row["progress"] is not None and progress is None,
            "message": task_message(model_admin.using, object_id),
            "cancel_requested": row["cancel_requested_at_ms"] is not None,
        },
        json_dumps_params={"allow_nan": False},
    )
