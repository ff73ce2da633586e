"""The demo's page: a form that queues an email, and the latest tasks."""

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.contrib import messages
from django.db import transaction
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

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

    @classmethod
    def from_record(cls, task):
        outcome = task.error if task.status == "failed" else task.result
        return cls(
            id=task.id,
            name=task.name,
            status=task.status,
            attempt=task.attempt,
            max_attempts=task.max_attempts,
            created=datetime.fromtimestamp(task.created_at_ms / 1000, tz=UTC),
            outcome="" if outcome is None else json.dumps(outcome, sort_keys=True),
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


@require_GET
def task_table(request):
    """Return the task table alone, for the page's auto-refresh."""
    return render(request, "demo/_tasks.html", {"tasks": recent_tasks()})
