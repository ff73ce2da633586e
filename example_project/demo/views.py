"""The demo's page: a form that queues an email, two tasks to watch, and the latest tasks.

"Count slowly" reports its progress and can be canceled from the table;
"Flaky fetch" fails twice and succeeds on its third attempt; a failed or
canceled task can be retried from the table.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib import messages
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

import cairnq_django

from .forms import EmailForm
from .tasks import deliver_email

RECENT_TASKS = 20


@dataclass(frozen=True)
class TaskRow:
    """One line of the task table."""

    id: str
    name: str
    status: str
    attempt: int
    max_attempts: int
    created: datetime
    outcome: str
    percent: int | None
    message: str
    can_cancel: bool
    can_retry: bool

    @classmethod
    def from_record(cls, task):
        # A retrying task is queued again with the last attempt's error kept.
        outcome = task.error if task.status in ("failed", "queued") else task.result
        return cls(
            id=task.id,
            name=task.name,
            status=task.status,
            attempt=task.attempt,
            max_attempts=task.max_attempts,
            created=datetime.fromtimestamp(task.created_at_ms / 1000, tz=UTC),
            outcome="" if outcome is None else json.dumps(outcome, sort_keys=True),
            percent=None if task.progress is None else round(task.progress * 100),
            message=task.message or "",
            can_cancel=task.status in ("queued", "running") and not task.cancel_requested_at_ms,
            can_retry=task.status in ("failed", "canceled"),
        )


def recent_tasks():
    """Return the newest tasks of every name and status."""
    return [TaskRow.from_record(task) for task in cairnq_django.list_tasks(limit=RECENT_TASKS)]


@require_http_methods(["GET", "POST"])
def index(request):
    """Show the form and the task table; on a valid POST, queue an email."""
    form = EmailForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            # The task row commits with everything else this transaction
            # writes, or not at all: a worker never sees a half-done request.
            if request.POST.get("via") == "framework":
                task = deliver_email.enqueue(**form.cleaned_data)
                name = "deliver_email (django.tasks)"
            else:
                task = cairnq_django.enqueue("send_email", form.cleaned_data)
                name = "send_email"
        messages.success(request, f"Queued {name} as task {task.id}.")
        return redirect("demo:index")
    return render(request, "demo/index.html", {"form": form, "tasks": recent_tasks()})


@require_POST
def start(request, kind):
    """Queue one of the watchable tasks: a long one with progress, or a flaky one."""
    if kind not in ("long", "flaky"):
        raise Http404("There is no such demo task.")
    if kind == "long":
        task = cairnq_django.enqueue("count_slowly", {"steps": 30, "pause": 1.0})
        messages.success(request, f"Queued count_slowly as task {task.id}: watch it count.")
    else:
        task = cairnq_django.enqueue("flaky_fetch", {"succeed_on": 3}, max_attempts=3)
        messages.success(
            request, f"Queued flaky_fetch as task {task.id}: it fails twice, then succeeds."
        )
    return redirect("demo:index")


@require_POST
def cancel(request, task_id):
    """Cancel a queued task, or ask a running one to stop."""
    task = cairnq_django.cancel(task_id)
    if task is None:
        messages.info(request, f"Task {task_id} had already finished.")
    elif task.status == "canceled":
        messages.success(request, f"Canceled task {task_id}.")
    else:
        messages.success(request, f"Asked task {task_id} to stop; it ends at its next step.")
    return redirect("demo:index")


@require_POST
def retry(request, task_id):
    """Queue a failed or canceled task again."""
    if cairnq_django.retry(task_id) is None:
        messages.info(request, f"Task {task_id} is not failed or canceled.")
    else:
        messages.success(request, f"Queued task {task_id} again.")
    return redirect("demo:index")


@require_GET
def task_table(request):
    """Return the task table alone, for the page's auto-refresh."""
    return render(request, "demo/_tasks.html", {"tasks": recent_tasks()})
