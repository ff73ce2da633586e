"""Test settings whose default alias uses Django's connection pool (PostgreSQL only).

CAIRNQ_TEST_POOL is the pool's options as JSON (psycopg_pool's ConnectionPool
arguments); tests start worker processes with these settings.
"""

import copy
import json
import os

from .settings import *  # noqa: F401,F403
from .settings import DATABASES

DATABASES = copy.deepcopy(DATABASES)
DATABASES["default"]["OPTIONS"] = {
    **DATABASES["default"].get("OPTIONS", {}),
    "pool": json.loads(os.environ.get("CAIRNQ_TEST_POOL", '{"min_size": 1, "max_size": 4}')),
}
# CAIRNQ_TEST_CONN_MAX_AGE: a lifetime the project "chose", which Django
# refuses on a pooled alias (the configuration-error test).
if os.environ.get("CAIRNQ_TEST_CONN_MAX_AGE"):
    DATABASES["default"]["CONN_MAX_AGE"] = int(os.environ["CAIRNQ_TEST_CONN_MAX_AGE"])
