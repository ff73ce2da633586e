"""The view that serves the database-side Prometheus gauges; mount it in your urls.

    from cairnq_django.observability.views import metrics
    urlpatterns = [path("cairnq/metrics", metrics)]

A scraper sends `Authorization: Bearer <CAIRNQ['METRICS_TOKEN']>`; a logged-in
user needs the permission to view tasks. Anyone else gets 401 or 403.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from ..conf import cairnq_settings

VIEW_PERMISSION = "cairnq_django.view_task"


def _token_matches(request: HttpRequest) -> bool:
    token = cairnq_settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if not token or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), str(token).encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Serve queue depth, oldest due ages and live workers in Prometheus' text format."""
    user = getattr(request, "user", None)
    allowed = _token_matches(request) or (
        user is not None and user.is_authenticated and user.has_perm(VIEW_PERMISSION)
    )
    if not allowed:
        if user is not None and user.is_authenticated:
            return HttpResponse("Permission to view tasks is required.\n", status=403,
                                content_type="text/plain")
        response = HttpResponse("A bearer token or a login is required.\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="cairnq"'
        return response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from .metrics import queue_registry

    return HttpResponse(generate_latest(queue_registry()), content_type=CONTENT_TYPE_LATEST)
