"""The workflows' admin: a list, and a page per workflow that draws its graph.

The page lists each step with its state and task, draws the graph as SVG
(views/workflow_graph.py), and offers cancel and the three retry modes to
users with the manage_workflow permission: POST only (the admin's CSRF check
applies), each through workflows/control.py, each leaving an admin log
entry. The list offers the same as actions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ..models import Workflow, WorkflowEdge, WorkflowStep
from ..workflows.control import RETRY_MODES, cancel_workflow, retry_workflow
from ..workflows.reads import WorkflowRun
from ..workflows.steps import InvalidWorkflow
from .display import compact_time, time_field
from .guarded import GuardedAdmin, acceptable_id, refuse_nul
from .views.workflow_graph import graph_svg

ACTIONS = ("cancel", *RETRY_MODES)


def _list_action(
    action: str, description: Any
) -> Callable[[WorkflowAdmin, HttpRequest, QuerySet[Workflow]], None]:
    """The list's action that does ``action`` to each selected workflow, as the page's button does."""

    @admin.action(permissions=["manage_workflow"], description=description)
    def act_on(self: WorkflowAdmin, request: HttpRequest, queryset: QuerySet[Workflow]) -> None:
        for row in queryset.using(self.using):
            self._act(request, row, action)

    return act_on


@admin.register(Workflow)
class WorkflowAdmin(GuardedAdmin):
    list_display = ("name", "id", "state", "progress", "created", "finished")
    list_filter = ("state",)
    search_fields = ("=id", "name", "=key")
    url_lookups = frozenset({"state__exact"})
    actions = ["cancel_selected", "retry_failed_only", "retry_failed_and_downstream", "retry_all"]

    @admin.display(description=gettext_lazy("steps done"))
    def progress(self, run: Workflow) -> str:
        return f"{run.steps_total - run.steps_open}/{run.steps_total}"

    created = time_field("created_at_ms", gettext_lazy("created"), compact_time, "created_at_ms")
    finished = time_field("finished_at_ms", gettext_lazy("finished"), compact_time, "finished_at_ms")

    # Django's @admin.action(permissions=["manage_workflow"]) asks this.
    def has_manage_workflow_permission(self, request: HttpRequest) -> bool:
        return self.has_perm(request, "manage_workflow")

    # ------------------------------------------------------------ the page
    def get_urls(self) -> list[URLPattern]:
        act = self.post_view(self.act_view, "manage_workflow")
        return [path("<path:object_id>/act/", act, name="cairnq_django_workflow_act"), *super().get_urls()]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The workflow page: its graph, its steps, and the actions the user may take."""
        refuse_nul(request)
        self.require_view_permission(request)
        run = self._run(object_id)
        steps = WorkflowStep.objects.using(self.using).filter(workflow_id=run.id)
        names = dict(steps.values_list("pk", "name"))
        parents: dict[str, list[str]] = defaultdict(list)
        for parent, child in WorkflowEdge.objects.using(self.using).filter(
            workflow_id=run.id
        ).values_list("parent_id", "child_id"):
            parents[names[child]].append(names[parent])

        def task_url(task_id: str) -> str:
            return reverse("admin:cairnq_django_task_change", args=[quote(task_id)])

        return self.render_page(request, "admin/cairnq_django/workflow/graph.html", {
            "title": _("Workflow %(name)s") % {"name": run.name},
            "run": run,
            "graph": graph_svg(run.steps, parents, task_url),
            "steps": [
                {"step": step, "url": task_url(step.task_id) if step.task_id else None}
                for step in run.steps
            ],
            "can_manage": self.has_manage_workflow_permission(request),
            "act_url": reverse("admin:cairnq_django_workflow_act", args=[quote(run.id)]),
            "retry_modes": RETRY_MODES,
        })

    def _run(self, object_id: str) -> WorkflowRun:
        object_id = unquote(object_id)  # the admin's URLs quote ids ("_" is "_5F")
        if not acceptable_id(object_id):
            raise Http404
        try:
            return WorkflowRun.load(object_id, using=self.using)
        except Workflow.DoesNotExist:
            raise Http404(_("No workflow has this id.")) from None

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel or retry the workflow (POST, manage_workflow: see get_urls), then back to its page."""
        run = self._run(object_id)
        back = HttpResponseRedirect(reverse("admin:cairnq_django_workflow_change", args=[quote(run.id)]))
        action = self.posted_action(request, ACTIONS)
        if action is None:
            return back
        self._act(request, Workflow.objects.using(self.using).get(pk=run.id), action)
        return back

    def _act(self, request: HttpRequest, row: Workflow, action: str) -> None:
        try:
            if action == "cancel":
                count = cancel_workflow(row.pk, using=self.using)
                text = _("Canceled workflow %(id)s: %(count)d steps had not ended.")
            else:
                count = retry_workflow(row.pk, mode=action, using=self.using)
                text = _("Retrying workflow %(id)s (%(mode)s): %(count)d steps run again.")
        except InvalidWorkflow as exc:
            self.message_user(request, str(exc), messages.WARNING)
            return
        self.log_change(request, row, [{"changed": {"fields": [action]}}])
        self.message_user(request, text % {"id": row.pk, "count": count, "mode": action}, messages.SUCCESS)

    # ------------------------------------------------------------ the list's actions
    cancel_selected = _list_action("cancel", gettext_lazy("Cancel selected workflows"))
    retry_failed_only = _list_action(
        "failed_only", gettext_lazy("Retry failed steps of selected workflows"))
    retry_failed_and_downstream = _list_action(
        "failed_and_downstream", gettext_lazy("Retry failed steps and everything downstream"))
    retry_all = _list_action("all", gettext_lazy("Retry selected workflows from the start"))
