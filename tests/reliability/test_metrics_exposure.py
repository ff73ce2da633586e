"""`cairnq_worker --metrics-port` keeps its unauthenticated server to this host unless told (issue 21).

prometheus_client's server answers every path with task and queue names,
counters and process memory, and has no authentication, so a worker must not
open it on every interface because someone asked for a port.
"""

from __future__ import annotations

import re
import socket
import urllib.request

import pytest

from cairnq_django.management.commands.cairnq_worker import Command
from tests.workerutil import WorkerProcess, wait_for

prometheus_client = pytest.importorskip("prometheus_client")

from cairnq_django.observability import metrics  # noqa: E402

# Every interface: what --metrics-addr must be given to reach the server from elsewhere.
EVERYWHERE = "0.0.0.0"  # noqa: S104


def parser():
    return Command().create_parser("manage.py", "cairnq_worker")


def test_the_metrics_server_listens_on_the_loopback_by_default():
    assert parser().parse_args(["--metrics-port", "0"]).metrics_addr == "127.0.0.1"
    assert parser().parse_args(["--metrics-port", "0", "--metrics-addr", EVERYWHERE]
                               ).metrics_addr == EVERYWHERE


def test_help_says_the_server_has_no_authentication():
    text = " ".join(parser().format_help().split())
    assert "no authentication" in text
    assert "Default: 127.0.0.1" in text


def test_serve_worker_metrics_binds_the_loopback_unless_told(monkeypatch):
    bound = []

    def fake_start(port, addr):
        bound.append(addr)

    monkeypatch.setattr(metrics, "start_http_server", fake_start)
    try:
        metrics.serve_worker_metrics(0)
        metrics.serve_worker_metrics(0, EVERYWHERE)
    finally:
        metrics.disconnect_worker_metrics()
    assert bound == ["127.0.0.1", EVERYWHERE]


def outward_address() -> str | None:
    """This host's address on its outward interface, if it has one besides the loopback."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 9))  # UDP: nothing is sent
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=10).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_real_worker_serves_metrics_on_the_loopback_only(live_store, child_env):
    worker = WorkerProcess(child_env, "-v", "2", "--metrics-port", "0")
    try:
        match = wait_for(
            lambda: re.search(r"Serving worker metrics on http://([^:]+):(\d+)/metrics",
                              worker.output()),
            timeout=60, message="The worker did not log its metrics address.",
        )
        host, port = match.group(1), int(match.group(2))
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        outward = outward_address()
        from_outside_refused = None if outward is None else refused(outward, port)
    finally:
        worker.stop()
    assert host == "127.0.0.1"
    assert b"cairnq_worker_heartbeats_late_total" in body
    if from_outside_refused is None:
        pytest.skip("this host has no address besides the loopback to try from")
    assert from_outside_refused
