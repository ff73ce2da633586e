"""Command line: run a folder of conformance scenarios on a throwaway test database.

    python -m cairnq_django.conformance --settings mysite.settings DIR [--database ALIAS]

The scenarios never touch the alias's real database: Django's test-database
machinery creates (and migrates) a fresh one beside it and destroys it after.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the scenarios, print one line each and a summary; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m cairnq_django.conformance",
        description="Run CairnQ conformance scenarios against a fresh test database.",
    )
    parser.add_argument("directory", help="Folder of *.json scenario files.")
    parser.add_argument(
        "--settings",
        help="Django settings module (default: the DJANGO_SETTINGS_MODULE environment variable).",
    )
    parser.add_argument(
        "--database",
        help="Database alias whose engine to test (default: CAIRNQ['DATABASE']).",
    )
    args = parser.parse_args(argv)
    if args.settings:
        os.environ["DJANGO_SETTINGS_MODULE"] = args.settings
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        print("Pass --settings or set DJANGO_SETTINGS_MODULE.", file=sys.stderr)
        return 2
    import django

    django.setup()

    from django.db import connections

    from ..conf import cairnq_settings
    from ..store.leases import get_leases
    from .runner import ConformanceError, load_scenarios, run_scenarios

    try:
        scenarios = load_scenarios(args.directory)
    except ConformanceError as exc:
        print(exc, file=sys.stderr)
        return 2
    alias = args.database or cairnq_settings.DATABASE
    if alias not in connections:
        print(f"There is no database alias {alias!r} in DATABASES.", file=sys.stderr)
        return 2

    connection = connections[alias]
    real_name = connection.settings_dict["NAME"]
    # autoclobber: a test database left over from an interrupted run is
    # replaced without a prompt, as `manage.py test --noinput` does.
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    print(f"Running {len(scenarios)} scenarios on {connection.vendor} test database {test_name}.")
    try:
        results = run_scenarios(
            get_leases(alias), scenarios, on_result=lambda result: print(result, flush=True)
        )
    finally:
        connection.creation.destroy_test_db(real_name, verbosity=0)
    failed = sum(not result.passed for result in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
