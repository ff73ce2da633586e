"""What the cairnq_* commands share."""

from __future__ import annotations

import argparse

from ..conf import cairnq_settings
from ..validators import cli_database


def add_database_argument(parser: argparse.ArgumentParser) -> None:
    """Every command's --database, worded once; None (not given) means CAIRNQ['DATABASE']."""
    parser.add_argument(
        "--database", metavar="ALIAS", type=cli_database,
        help="Database alias holding the CairnQ tables. Default: CAIRNQ['DATABASE'] "
        f"({cairnq_settings.DATABASE!r}).",
    )
