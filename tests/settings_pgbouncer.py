"""Test settings for child processes whose default alias goes through PgBouncer.

scripts/test (lib.sh's ensure_pgbouncer) runs a PgBouncer in transaction
pooling mode and exports its port as CAIRNQ_PGBOUNCER_PORT; it passes every
database name through to the PostgreSQL on 5432, so CAIRNQ_CHILD_DB_NAME (the
test database pytest-django created there) is reachable by name.
"""

import copy
import os

from .settings import *  # noqa: F401,F403
from .settings import DATABASES

DATABASES = copy.deepcopy(DATABASES)
DATABASES["default"].update(
    PORT=os.environ["CAIRNQ_PGBOUNCER_PORT"],
    # Named cursors outlive the transaction PgBouncer hands the server back after.
    DISABLE_SERVER_SIDE_CURSORS=True,
)
