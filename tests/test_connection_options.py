"""TCP options (keepalives, tcp_user_timeout, connect_timeout) on the connections CairnQ keeps open."""

from __future__ import annotations

import socket

import pytest
from django.db import connection, connections
from django.test import override_settings

from cairnq_django import enqueue, wait
from cairnq_django.checks import check_settings
from cairnq_django.connection_options import (
    DEFAULT_CONNECTION_OPTIONS,
    connection_options,
    with_connection_options,
)
from cairnq_django.wakeup.postgres import postgres_params
from cairnq_django.worker.connections import WorkerConnectionPolicy

only_postgres = pytest.mark.skipif(connection.vendor != "postgresql", reason="TCP to PostgreSQL")


def test_defaults_and_overrides():
    assert connection_options() == DEFAULT_CONNECTION_OPTIONS
    with override_settings(CAIRNQ={"CONNECTION_OPTIONS": {"keepalives_idle": 30, "tcp_user_timeout": None}}):
        options = connection_options()
        assert options["keepalives_idle"] == 30 and "tcp_user_timeout" not in options
        assert options["keepalives_count"] == 3
    with override_settings(CAIRNQ={"CONNECTION_OPTIONS": False}):
        assert connection_options() == {}


@pytest.mark.parametrize(
    "setting, errors",
    [
        ({"keepalives_idle": 10}, []),
        (False, []),
        ({"sslmode": "require"}, []),
        ("keepalives=1", ["cairnq.E050"]),
        ({"tcp_user_timeout": -1}, ["cairnq.E050"]),
        ({"keepalives_idle": "4"}, ["cairnq.E050"]),
    ],
)
def test_the_setting_is_checked(setting, errors):
    with override_settings(CAIRNQ={"CONNECTION_OPTIONS": setting}):
        assert sorted(m.id for m in check_settings()) == errors


def test_the_alias_options_win_and_sqlite_is_untouched():
    merged = with_connection_options("default", {"keepalives_idle": 60})
    if connection.vendor == "postgresql":
        assert merged["keepalives_idle"] == 60 and merged["tcp_user_timeout"] == 7000
    else:
        assert merged == {"keepalives_idle": 60}


def test_the_worker_policy_applies_and_restores_the_options(settings):
    config = connections.settings["default"]
    before = config.get("OPTIONS")
    policy = WorkerConnectionPolicy()
    policy.apply()
    try:
        options = config.get("OPTIONS") or {}
        if connection.vendor == "postgresql":
            assert options["keepalives"] == 1 and options["tcp_user_timeout"] == 7000
        else:
            assert "keepalives" not in options
    finally:
        policy.restore()
    assert config.get("OPTIONS") == before


@only_postgres
def test_a_worker_connection_carries_them(transactional_db):
    policy = WorkerConnectionPolicy()
    policy.apply()
    try:
        connections["default"].close()
        connections["default"].ensure_connection()
        params = connections["default"].connection.info.get_parameters()
        assert params["keepalives_idle"] == "4" and params["tcp_user_timeout"] == "7000"
        assert params["connect_timeout"] == "5"
    finally:
        connections["default"].close()
        policy.restore()


@only_postgres
def test_the_listener_gets_them(db):
    params = postgres_params("default")
    assert params["keepalives"] == 1 and params["keepalives_count"] == 3


def _tcp(sock_fd, option):
    sock = socket.socket(fileno=sock_fd)
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, option)
    finally:
        sock.detach()


@only_postgres
def test_wait_sets_them_on_the_callers_connection(live_store):
    task = enqueue("tests.echo", {"x": 1})
    connections["default"].close()
    with pytest.raises(Exception, match="Timed out"):
        wait(task.id, timeout=0.05)
    raw = connections["default"].connection
    assert raw is not None
    if not raw.info.get_parameters().get("host", "").startswith("/"):
        assert _tcp(raw.fileno(), socket.TCP_KEEPIDLE) == 4
        assert _tcp(raw.fileno(), socket.TCP_USER_TIMEOUT) == 7000
