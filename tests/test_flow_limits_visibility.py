"""Flow limits at run time and in sight: `cairnq_queue limit|unlimit|limits`,
`cairnq_status` (text and --json) and the Prometheus gauges.

The limits themselves (what the claim does with them) are tested in
tests/test_flow_limits.py; here, that each view shows what limit_usage() reads.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from cairnq_django import clear_limit, effective_limits, enqueue, set_limit
from cairnq_django.models import FlowLimit
from cairnq_django.observability.overview import overview

pytestmark = pytest.mark.django_db

SETTINGS_LIMITS = [
    {"name": "reports.generate", "concurrency": 3},
    {"key_prefix": "account:", "concurrency": 1},
    {"queue": "partner", "rate": 20, "per": timedelta(minutes=1)},
]


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def queue(*args: str) -> str:
    return run("cairnq_queue", *args)


@pytest.fixture
def limited(settings):
    settings.CAIRNQ = {"LIMITS": SETTINGS_LIMITS}


def claim(store, queue: str, limit: int, names: list[str] | None = None) -> list:
    """Claim as a worker does under the limits in force (the start log is written)."""
    return store.claim_limited(
        limits=effective_limits(), queues=[queue], worker_id="w1", limit=limit, names=names
    ).tasks


@pytest.fixture
def busy(store, limited):
    """Under the settings' limits: 2 of 5 reports running, account:1 running with one more
    waiting, account:2 waiting, and 2 partner tasks started in the last second."""
    for _ in range(5):
        enqueue("reports.generate", {})
    assert len(claim(store, "default", 2, ["reports.generate"])) == 2
    enqueue("accounts.sync", {}, queue="accounts", concurrency_key="account:1")
    enqueue("accounts.sync", {}, queue="accounts", concurrency_key="account:1")
    (first,) = claim(store, "accounts", 1)
    assert first.queue == "accounts"
    # After the claim: tasks enqueued in one millisecond are claimed in id order.
    enqueue("accounts.sync", {}, queue="accounts", concurrency_key="account:2")
    for _ in range(3):
        enqueue("partner.call", {}, queue="partner")
    assert len(claim(store, "partner", 2)) == 2
    return store


# -------------------------------------------------------------- the command
def test_limit_unlimit_and_limits_round_trip(store):
    assert "No flow limits" in queue("limits")
    out = queue("limit", "--name", "reports.generate", "--concurrency", "3")
    assert "Limited task name 'reports.generate' to 3 running." in out
    assert "Workers apply it within about a second." in out
    out = queue("limit", "--key-prefix", "account:", "--concurrency", "1")
    assert "'account:' to 1 running per key" in out
    out = queue("limit", "--queue", "partner", "--rate", "20", "--per", "1s")
    assert "Limited queue 'partner' to 20 starts per 1s." in out
    queue("limit", "--queue", "slow", "--concurrency", "2", "--rate", "1000", "--per", "1h")
    assert {(limit.scope, limit.value): (limit.concurrency, limit.rate, limit.per_ms)
            for limit in effective_limits()} == {
        ("name", "reports.generate"): (3, None, None),
        ("key_prefix", "account:"): (1, None, None),
        ("queue", "partner"): (None, 20, 1000),
        ("queue", "slow"): (2, 1000, 3_600_000),
    }
    assert set(FlowLimit.objects.values_list("changed_by", flat=True)) == {"manage.py cairnq_queue"}
    lines = queue("limits").splitlines()
    assert lines[0].split() == ["SCOPE", "VALUE", "SOURCE", "LIMIT", "RUNNING", "STARTS", "HELD"]
    assert any(line.startswith("task name") and "reports.generate" in line and "0/3" in line
               for line in lines)
    assert any("partner" in line and "0/20 in 1s" in line for line in lines)
    data = json.loads(queue("limits", "--json"))["limits"]
    assert {row["value"]: row["source"] for row in data} == dict.fromkeys(
        ["reports.generate", "account:", "partner", "slow"], "runtime"
    )
    assert "Cleared the runtime limit on task name 'reports.generate'." in queue(
        "unlimit", "--name", "reports.generate"
    )
    assert "There was no runtime limit" in queue("unlimit", "--name", "reports.generate")
    assert ("name", "reports.generate") not in {(x.scope, x.value) for x in effective_limits()}


def test_a_runtime_limit_replaces_the_settings_one_until_unlimit(store, limited):
    queue("limit", "--name", "reports.generate", "--concurrency", "5")
    rows = {row["value"]: row for row in json.loads(queue("limits", "--json"))["limits"]}
    assert (rows["reports.generate"]["concurrency"], rows["reports.generate"]["source"]) == (
        5, "runtime"
    )
    assert rows["account:"]["source"] == "settings"
    out = queue("unlimit", "--name", "reports.generate")
    assert "CAIRNQ['LIMITS'] still limits it: 3 running." in out
    rows = {row["value"]: row for row in json.loads(queue("limits", "--json"))["limits"]}
    assert (rows["reports.generate"]["concurrency"], rows["reports.generate"]["source"]) == (
        3, "settings"
    )


def test_limits_shows_the_use_of_each_limit(busy):
    data = {row["value"]: row for row in json.loads(queue("limits", "--json"))["limits"]}
    assert data["reports.generate"] == {
        "scope": "name", "value": "reports.generate", "source": "settings", "concurrency": 3,
        "rate": None, "per_ms": None, "limit": "3 running", "running": 2,
        "keys_at_limit": None, "busiest_key": None, "starts_in_window": None, "held": 2,
    }
    account = data["account:"]
    assert (account["running"], account["keys_at_limit"], account["held"]) == (1, 1, 1)
    assert account["busiest_key"] == "account:1"
    assert account["limit"] == "1 running per key"
    partner = data["partner"]
    assert (partner["rate"], partner["per_ms"]) == (20, 60_000)
    assert (partner["starts_in_window"], partner["held"]) == (2, 0)
    text = queue("limits")
    assert "1/1 (account:1), 1 keys at the limit" in text
    assert "2/20 in 1m" in text


def test_lift_removes_a_settings_limit_until_unlimit(store, limited):
    out = queue("limit", "--name", "reports.generate", "--lift")
    assert "Lifted every limit on task name 'reports.generate' until unlimit." in out
    assert ("name", "reports.generate") not in {(x.scope, x.value) for x in effective_limits()}
    text = queue("limits")
    assert "No limit on task name 'reports.generate': lifted at run time" in text
    data = json.loads(queue("limits", "--json"))
    assert data["lifted"] == [{"scope": "name", "value": "reports.generate"}]
    assert "reports.generate" not in {row["value"] for row in data["limits"]}
    out = queue("unlimit", "--name", "reports.generate")
    assert "CAIRNQ['LIMITS'] still limits it: 3 running." in out
    assert json.loads(queue("limits", "--json"))["lifted"] == []


@pytest.mark.parametrize("args, message", [
    (("limit",), "limit needs one of --queue, --name or --key-prefix"),
    (("limit", "--name", "x"), "limit needs --concurrency, --rate or both"),
    (("limit", "--name", "x", "--lift", "--concurrency", "2"), "--lift goes alone"),
    (("unlimit", "--name", "x", "--lift"), "--lift goes with limit only"),
    (("limit", "--name", "x", "--concurrency", "1", "--per", "1s"),
     "--per is the period of a --rate; give the rate too"),
    (("unlimit",), "unlimit needs one of --queue, --name or --key-prefix"),
    (("unlimit", "--name", "x", "--concurrency", "2"), "--concurrency goes with limit only"),
    (("limit", "reports", "--concurrency", "2"), "limit takes the queue as --queue reports"),
    (("limits", "emails"), "limits takes no queue name"),
    (("pause", "emails", "--name", "x"), "--name goes with limit and unlimit only"),
    (("list", "--key-prefix", "a:"), "--key-prefix goes with limit and unlimit only"),
    (("limits", "--rate", "3"), "--rate goes with limit only"),
    (("limit", "--name", "x", "--concurrency", "1", "--json"),
     "--json goes with list and limits only"),
    (("limit", "--name", "", "--concurrency", "1"), "non-empty string"),
    (("limit", "--queue", "x" * 300, "--concurrency", "1"), "at most 255 characters"),
    (("limit", "--name", "a\x00b", "--concurrency", "1"), "NUL"),
])
def test_the_limit_commands_refuse_bad_input_in_one_line(store, args, message):
    with pytest.raises(CommandError, match=message):
        queue(*args)
    assert not FlowLimit.objects.exists()


def test_the_help_explains_limits(store):
    from cairnq_django.management.commands.cairnq_queue import Command

    text = Command().create_parser("manage.py", "cairnq_queue").format_help()
    for phrase in ("--key-prefix PREFIX", "--concurrency N", "--rate N", "--per DURATION",
                   "unlimit SCOPE", "concurrency_key", "without restarting", "other CairnQ SDKs",
                   "limit --queue partner --rate 20 --per 1s"):
        assert phrase in " ".join(text.split()), phrase


# ------------------------------------------------------------ cairnq_status
def test_cairnq_status_shows_the_limits_and_their_use(busy):
    text = run("cairnq_status")
    assert "Flow limits: 3" in text
    lines = text.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("SCOPE")))
    assert lines[header + 1].split()[:4] == ["task", "name", "reports.generate", "settings"]
    assert "2/3" in lines[header + 1]
    data = json.loads(run("cairnq_status", "--json"))
    assert [(row["scope"], row["value"], row["running"], row["held"]) for row in data["limits"]] == [
        ("name", "reports.generate", 2, 2),
        ("key_prefix", "account:", 1, 1),
        ("queue", "partner", 2, 0),
    ]
    assert data["limits_error"] is None
    assert data["limits"][1]["busiest_key"] == "account:1"
    assert "1/1 (account:1), 1 keys at the limit" in text


def test_cairnq_status_without_limits_says_nothing_of_them(store):
    assert "Flow limits" not in run("cairnq_status")
    assert json.loads(run("cairnq_status", "--json"))["limits"] == []


def test_invalid_limit_settings_do_not_break_the_views(store, settings):
    settings.CAIRNQ = {"LIMITS": [{"name": "x", "concurrency": 0}]}
    view = overview()
    assert view.limits == [] and "concurrency" in (view.limits_error or "")
    assert "CAIRNQ['LIMITS'] is invalid" in run("cairnq_status")
    assert "concurrency" in json.loads(run("cairnq_status", "--json"))["limits_error"]


def test_a_lifted_settings_limit_is_not_shown(store, limited):
    set_limit("name", "reports.generate", by="ops")  # neither concurrency nor rate: lifted
    data = json.loads(run("cairnq_status", "--json"))
    assert "reports.generate" not in {row["value"] for row in data["limits"]}
    assert clear_limit("name", "reports.generate") is True
    data = json.loads(run("cairnq_status", "--json"))
    assert "reports.generate" in {row["value"] for row in data["limits"]}


# ----------------------------------------------------------------- metrics
def test_prometheus_has_gauges_per_limit(busy, client, settings):
    pytest.importorskip("prometheus_client")
    from tests.test_observability_metrics import samples, value

    settings.CAIRNQ = {"LIMITS": SETTINGS_LIMITS, "METRICS_TOKEN": "t0ken"}
    response = client.get("/cairnq/metrics", HTTP_AUTHORIZATION="Bearer t0ken")
    assert response.status_code == 200
    found = samples(response.content.decode())
    name = {"scope": "name", "value": "reports.generate"}
    assert value(found, "cairnq_flow_limit_running", **name) == 2
    assert value(found, "cairnq_flow_limit_concurrency", **name) == 3
    assert value(found, "cairnq_flow_limit_held", **name) == 2
    assert value(found, "cairnq_flow_limit_rate", **name) is None
    key = {"scope": "key_prefix", "value": "account:"}
    assert value(found, "cairnq_flow_limit_running", **key) == 1
    assert value(found, "cairnq_flow_limit_keys_at_limit", **key) == 1
    assert value(found, "cairnq_flow_limit_held", **key) == 1
    partner = {"scope": "queue", "value": "partner"}
    assert value(found, "cairnq_flow_limit_rate", **partner) == 20
    assert value(found, "cairnq_flow_limit_rate_period_seconds", **partner) == 60
    assert value(found, "cairnq_flow_limit_starts_in_window", **partner) == 2
    assert value(found, "cairnq_flow_limit_concurrency", **partner) is None


def test_prometheus_escapes_a_hostile_limit_value(store, client, settings):
    pytest.importorskip("prometheus_client")
    from tests.test_observability_metrics import samples, value

    settings.CAIRNQ = {"METRICS_TOKEN": "t0ken"}
    hostile = 'a"b\\c\nd} 1\ncairnq_fake 9'
    set_limit("name", hostile, concurrency=2)
    response = client.get("/cairnq/metrics", HTTP_AUTHORIZATION="Bearer t0ken")
    found = samples(response.content.decode())
    assert value(found, "cairnq_flow_limit_concurrency", scope="name", value=hostile) == 2
    assert not [key for key in found if key[0] == "cairnq_fake"]
