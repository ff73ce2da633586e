"""{% cq_breadcrumbs %}: the markup each Django version's admin stylesheet styles."""

from django.template import Context, Template

from cairnq_django import compat
from cairnq_django.models import Task

TEMPLATE = Template(
    "{% load cairnq_admin %}{% cq_breadcrumbs opts current changelist_url %}"
)


def _render(monkeypatch, as_list: bool, changelist_url: str = "/admin/cairnq_django/task/") -> str:
    monkeypatch.setattr(compat, "ADMIN_BREADCRUMBS_AS_LIST", as_list)
    return TEMPLATE.render(Context({
        "opts": Task._meta, "current": "Queue stats <b>", "changelist_url": changelist_url,
    }))


def test_the_flag_follows_the_installed_django():
    import django

    assert compat.ADMIN_BREADCRUMBS_AS_LIST == (django.VERSION >= (6, 1))


def test_django_61_gets_an_ordered_list_with_the_current_page_marked(monkeypatch):
    html = _render(monkeypatch, as_list=True)
    assert html.startswith('<ol class="breadcrumbs">') and html.rstrip().endswith("</ol>")
    assert '<li><a href="/admin/">Home</a></li>' in html
    assert '<li><a href="/admin/cairnq_django/">' in html
    assert '<li><a href="/admin/cairnq_django/task/">Tasks</a></li>' in html
    assert '<li aria-current="page">Queue stats &lt;b&gt;</li>' in html
    assert "&rsaquo;" not in html and "<div" not in html


def test_django_52_and_60_get_a_div_with_separators(monkeypatch):
    html = _render(monkeypatch, as_list=False)
    assert html.startswith('<div class="breadcrumbs">') and html.rstrip().endswith("</div>")
    assert html.count("&rsaquo;") == 3
    assert '<a href="/admin/cairnq_django/task/">Tasks</a>' in html
    assert html.rstrip().removesuffix("</div>").strip().endswith("&rsaquo; Queue stats &lt;b&gt;")
    assert "<li" not in html


def test_without_a_list_url_the_trail_stops_at_the_app(monkeypatch):
    html = _render(monkeypatch, as_list=True, changelist_url="")
    assert html.count("<li") == 3 and "/admin/cairnq_django/task/" not in html
