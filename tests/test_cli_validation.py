"""Bad option values of the CairnQ commands are argparse errors that name the option.

The options are checked by the shared argparse types (validators.cli_integer,
validators.cli_database, retention.cli_duration), so every command words the
same mistake the same way, and nothing reaches the database.
"""

from __future__ import annotations

import argparse
from unittest import mock

import pytest
from django.conf import settings
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError

from cairnq_django.validators import cli_database, cli_integer

# Every alias of the test settings (a PgBouncer run adds "bouncer").
KNOWN_ALIASES = ", ".join(sorted(settings.DATABASES))

BAD_OPTIONS = [
    ("cairnq_sweep", ["--older-than", "1h", "--batch-size", "0"],
     "argument --batch-size: expected an integer >= 1, got '0'"),
    ("cairnq_sweep", ["--older-than", "1h", "--batch-size", "-3"],
     "argument --batch-size: expected an integer >= 1, got '-3'"),
    ("cairnq_sweep", ["--older-than", "1h", "--batch-size", "ten"],
     "argument --batch-size: expected an integer, got 'ten'"),
    ("cairnq_sweep", ["--older-than", "soon"],
     "argument --older-than: 'soon' is not a duration; write a number of milliseconds or a "
     "number with a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d."),
    ("cairnq_sweep", ["--older-than", "1h", "--database", "nope"],
     f"argument --database: 'nope' is not in settings.DATABASES; use one of {KNOWN_ALIASES}"),
    ("cairnq_schedule", ["--next", "0"], "argument --next: expected an integer >= 1, got '0'"),
    ("cairnq_schedule", ["--next", "x"], "argument --next: expected an integer, got 'x'"),
    ("cairnq_schedule", ["--next", "1001"],
     "argument --next: expected an integer <= 1000, got '1001'"),
    ("cairnq_schedule", ["--database", "nope"],
     f"argument --database: 'nope' is not in settings.DATABASES; use one of {KNOWN_ALIASES}"),
    ("cairnq_status", ["--database", "nope"],
     f"argument --database: 'nope' is not in settings.DATABASES; use one of {KNOWN_ALIASES}"),
    ("cairnq_health", ["--max-age", "5 minutes"],
     "argument --max-age: '5 minutes' is not a duration; write a number of milliseconds or a "
     "number with a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d."),
    ("cairnq_health", ["--database", "nope"],
     f"argument --database: 'nope' is not in settings.DATABASES; use one of {KNOWN_ALIASES}"),
    ("cairnq_queue", ["limit", "--name", "x", "--concurrency", "0"],
     "argument --concurrency: expected an integer >= 1, got '0'"),
    ("cairnq_queue", ["limit", "--name", "x", "--concurrency", "three"],
     "argument --concurrency: expected an integer, got 'three'"),
    ("cairnq_queue", ["limit", "--name", "x", "--concurrency", "2147483648"],
     "argument --concurrency: expected an integer <= 2147483647, got '2147483648'"),
    ("cairnq_queue", ["limit", "--queue", "x", "--rate", "-1"],
     "argument --rate: expected an integer >= 1, got '-1'"),
    ("cairnq_queue", ["limit", "--queue", "x", "--rate", "20", "--per", "a second"],
     "argument --per: 'a second' is not a duration; write a number of milliseconds or a "
     "number with a unit (ms, s, m, h, d, w), e.g. 30m, 2h or 7d."),
    ("cairnq_queue", ["limit", "--queue", "x", "--rate", "20", "--per", "0s"],
     "argument --per: a rate's period must be at least 1 ms, got '0s'"),
    ("cairnq_queue", ["limit", "--name", "x", "--queue", "y"],
     "argument --queue: not allowed with argument --name"),
]
IDS = [f"{command} {' '.join(args[-2:])}" for command, args, _ in BAD_OPTIONS]


@pytest.mark.parametrize("command, args, message", BAD_OPTIONS, ids=IDS)
def test_call_command_refuses_a_bad_option_naming_it(command, args, message):
    with pytest.raises(CommandError) as caught:
        call_command(command, *args)
    assert str(caught.value) == f"Error: {message}"


@pytest.mark.parametrize("command, args, message", BAD_OPTIONS, ids=IDS)
def test_the_command_line_prints_the_usage_and_the_error_and_exits_2(
    command, args, message, capsys
):
    with pytest.raises(SystemExit) as exited:
        load_command_class("cairnq_django", command).run_from_argv(["manage.py", command, *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: manage.py {command}")
    assert err.rstrip().endswith(f"{command}: error: {message}")


def parse(command, *args):
    parser = load_command_class("cairnq_django", command).create_parser("manage.py", command)
    return vars(parser.parse_args(args))


def test_good_values_arrive_converted():
    options = parse("cairnq_sweep", "--batch-size", "250", "--older-than", "1h30m")
    assert options["batch_size"] == 250 and options["older_than"] == 5_400_000
    assert parse("cairnq_sweep")["batch_size"] is None  # the setting decides
    assert parse("cairnq_schedule", "--next", "1000")["count"] == 1000
    assert parse("cairnq_schedule")["count"] == 1
    assert parse("cairnq_status", "--database", "default")["database"] == "default"
    assert parse("cairnq_health", "--max-age", "90s")["max_age"] == 90_000
    options = parse("cairnq_queue", "limit", "--key-prefix", "account:", "--rate", "20",
                    "--per", "1m", "--concurrency", "1")
    assert (options["limit_key_prefix"], options["rate"], options["per"], options["concurrency"]) == (
        "account:", 20, 60_000, 1
    )


def test_cli_integer_bounds():
    any_count = cli_integer(0)
    assert any_count("0") == 0 and any_count(" 7 ") == 7
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer >= 0, got '-1'"):
        any_count("-1")
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer, got '1.5'"):
        cli_integer()("1.5")
    assert cli_integer(maximum=3)("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer <= 3, got '4'"):
        cli_integer(maximum=3)("4")


def test_cli_database_lists_the_known_aliases():
    with mock.patch.dict(settings.DATABASES, {"other": settings.DATABASES["default"]}):
        assert cli_database("other") == "other"
        with pytest.raises(
            argparse.ArgumentTypeError,
            match=rf"^'x' is not in settings.DATABASES; use one of {KNOWN_ALIASES}, other$",
        ):
            cli_database("x")
