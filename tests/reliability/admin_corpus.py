"""What the hostile admin tests aim at: every admin URL of this app, found from the site itself.

The routes come from walking ``admin.site.get_urls()``, so a page registered
later (a new ModelAdmin, or a URL a ModelAdmin adds in get_urls) joins the
corpus without anyone listing it. A route whose shape the corpus cannot fill
in (a converter other than ``<path:object_id>``) fails test_every_route_is_fillable
instead of going untested.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db import models, transaction
from django.urls import URLPattern, URLResolver

APP_LABEL = "cairnq_django"
ADMIN = "/admin/"
OBJECT_ID = "<path:object_id>"


@dataclass(frozen=True)
class Route:
    """One admin route of this app: a path under /admin/, with {id} where an object id goes."""

    model: type[models.Model] | None
    path: str

    @property
    def per_object(self) -> bool:
        return "{id}" in self.path

    def url(self, object_id: str = "") -> str:
        """The route's URL; `object_id` is inserted as given (already quoted or percent-encoded)."""
        return ADMIN + self.path.replace("{id}", object_id)


def _walk(patterns: list[Any], prefix: str) -> Iterator[str]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern)


def our_models() -> dict[str, type[models.Model]]:
    """{"<app>/<model>/": model} for every model of this app registered with the admin site."""
    return {
        f"{model._meta.app_label}/{model._meta.model_name}/": model
        for model in admin.site._registry
        if model._meta.app_label == APP_LABEL
    }


def unfillable_routes() -> list[str]:
    """This app's routes holding a converter the corpus has no value for."""
    prefixes = tuple(our_models())
    return [
        raw for raw in _walk(admin.site.get_urls(), "")
        if raw.startswith(prefixes) and "<" in raw.replace(OBJECT_ID, "")
    ]


def admin_routes() -> list[Route]:
    """The admin index, this app's index, and every route of this app's model admins."""
    by_prefix = our_models()
    routes = [Route(None, ""), Route(None, f"{APP_LABEL}/")]
    for raw in _walk(admin.site.get_urls(), ""):
        for prefix, model in by_prefix.items():
            if raw.startswith(prefix):
                routes.append(Route(model, raw.replace(OBJECT_ID, "{id}")))
    return routes


def stored_ids(model: type[models.Model]) -> list[str]:
    """The model's primary keys as they appear in admin URLs (quoted by the admin's rules)."""
    return [quote(str(pk)) for pk in model._default_manager.order_by("pk").values_list("pk", flat=True)]


def request_status(client: Any, method: str, url: str, data: Any = None) -> int | str:
    """The response's status code, or the exception a view raised (as text)."""
    try:
        # A savepoint, so a failed statement on PostgreSQL does not abort the test's transaction.
        with transaction.atomic():
            if method == "get":
                response = client.get(url)
            else:
                response = client.post(url, data or {})
    except Exception as exc:  # noqa: BLE001 - a raised exception is the 500 being tested for
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    if response.status_code == 200 and response.get("Content-Type", "").startswith(
        "application/json"
    ):
        try:
            strict_json(response.content)
        except ValueError as exc:
            return f"not JSON: {exc}"
    return response.status_code


def strict_json(body: bytes | str) -> Any:
    """Decode JSON as a browser does: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(body, parse_constant=refuse)


def assert_no_500(results: list[tuple[str, int | str]]) -> None:
    failures = [
        (where, status) for where, status in results
        if not isinstance(status, int) or status >= 500
    ]
    assert failures == [], "\n".join(f"{where[:160]!r}: {status}" for where, status in failures)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "action", "data-url") and value and not value.startswith("#"):
                self.urls.append(value)


def links(html: str, page_url: str) -> list[str]:
    """Every href, form action and data-url of a page, as absolute paths (dot segments resolved)."""
    parser = _Links()
    parser.feed(html)
    resolved = []
    for url in parser.urls:
        parts = urlsplit(urljoin("http://testserver" + page_url, url))
        if parts.netloc == "testserver":
            resolved.append(parts.path)
    return resolved
