"""cairnq_worker's system checks: the web's after the first poll, everything else before any claim."""

from __future__ import annotations

import io

import pytest
from django.core import checks
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from cairnq_django import enqueue, get
from cairnq_django.management import worker_checks


@pytest.fixture
def registered():
    """Register checks for one test: registered(fn, *tags)."""
    added = []

    def register(fn, *tags):
        checks.register(fn, *tags)
        added.append(fn)

    yield register
    for fn in added:
        checks.registry.registry.registered_checks.discard(fn)


def run_worker(**options):
    err = io.StringIO()
    call_command("cairnq_worker", "--burst", skip_checks=False, stdout=io.StringIO(), stderr=err,
                 **options)
    return err.getvalue()


def _urls_error(app_configs, **kwargs):
    return [Error("The URLconf is broken.", id="tests.E901")]


def test_an_issue_of_the_web_checks_stops_the_worker_after_its_first_poll(live_store, registered):
    registered(_urls_error, checks.Tags.urls)
    task = enqueue("tests.echo", {"n": 1})
    with pytest.raises(SystemCheckError) as caught:
        run_worker()
    assert "(tests.E901) The URLconf is broken." in str(caught.value)
    assert str(caught.value).startswith("SystemCheckError: System check identified some issues:")
    # The first poll claimed it before the check ran; stopping let it finish.
    assert get(task.id).status == "succeeded"


@pytest.mark.parametrize("tags", [(checks.Tags.models,), (), (checks.Tags.urls, checks.Tags.models)])
def test_every_other_check_runs_before_anything_is_claimed(live_store, registered, tags):
    # A tag that is not the web's, no tag at all, or the web's beside another.
    registered(lambda app_configs, **kwargs: [Error("Not here.", id="tests.E902")], *tags)
    task = enqueue("tests.echo", {"n": 1})
    with pytest.raises(SystemCheckError, match=r"tests\.E902"):
        run_worker()
    assert get(task.id).status == "queued"


def test_which_checks_wait_for_the_first_poll():
    deferred = {
        f"{c.__module__}.{c.__name__}" for c in checks.registry.registry.get_checks()
        if worker_checks._after_first_poll(c)
    }
    assert "django.core.checks.urls.check_url_config" in deferred
    assert "django.contrib.admin.checks.check_dependencies" in deferred
    assert "django.contrib.auth.checks.check_middleware" in deferred  # untagged, requests only
    assert not any(name.startswith("cairnq_django.") for name in deferred)
    assert "django.core.checks.model_checks.check_all_models" not in deferred


def test_warnings_are_printed_once_and_the_worker_runs(live_store, registered):
    registered(lambda app_configs, **kwargs: [checks.Warning("Early.", id="tests.W903")])
    registered(lambda app_configs, **kwargs: [checks.Warning("Late.", id="tests.W904")],
               checks.Tags.urls)
    task = enqueue("tests.echo", {"n": 1})
    err = run_worker()
    assert err.count("(tests.W903) Early.") == 1 and err.count("(tests.W904) Late.") == 1
    assert get(task.id).status == "succeeded"


def test_silenced_issues_are_not_reported(live_store, registered):
    registered(_urls_error, checks.Tags.urls)
    with override_settings(SILENCED_SYSTEM_CHECKS=["tests.E901"]):
        assert "tests.E901" not in run_worker()


def test_skip_checks_skips_both_parts(live_store, registered):
    registered(lambda app_configs, **kwargs: [Error("Early.", id="tests.E905")])
    registered(_urls_error, checks.Tags.urls)
    task = enqueue("tests.echo", {"n": 1})
    call_command("cairnq_worker", "--burst", "--skip-checks", stdout=io.StringIO(),
                 stderr=io.StringIO())
    assert get(task.id).status == "succeeded"
