"""Retention: delete finished tasks on a schedule, in short bounded batches.

Nothing else removes rows, and payloads carry real data, so a deployment
without retention leaks disk. settings.CAIRNQ["RETENTION"] says what may go:

    None                                          # never sweep (the default)
    timedelta(days=7)                             # every finished task after 7 days
    {"succeeded": timedelta(hours=1),             # per status; a status left out
     "failed": timedelta(days=30)}                # is never swept
    [{"queue": "rpc", "older_than": 300_000},     # rules filtering by queue,
     {"status": "failed", "name": "emails.send",  # status and/or name
      "older_than": timedelta(days=90)}]

Numbers are milliseconds. Each rule is one `purge()` filter of the store, swept
in batches of SWEEP_BATCH_SIZE rows with a SWEEP_PAUSE between statements, so a
large backlog drains as a series of short writes that producers and workers
slip in between (on SQLite each statement holds the single write lock).

The modules: config (read and check the setting), rules (what a rule deletes,
one-off narrowing), sweeper (the batched delete loop), durations ('7d' <-> ms).
"""

from __future__ import annotations

from .config import RULE_KEYS, SETTING, parse_retention, retention_config_errors
from .durations import cli_duration, format_compact_duration, parse_duration
from .rules import RetentionRule, RuleResult, rules_for_overrides
from .sweeper import RetentionSweeper

__all__ = [
    "RULE_KEYS",
    "SETTING",
    "RetentionRule",
    "RetentionSweeper",
    "RuleResult",
    "cli_duration",
    "format_compact_duration",
    "parse_duration",
    "parse_retention",
    "retention_config_errors",
    "rules_for_overrides",
]
