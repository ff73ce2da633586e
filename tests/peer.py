"""Open the reference peer (`cairnq` 0.15.1) on the committed test database."""

from __future__ import annotations

import asyncio

from django.db import connection

from tests import catalog


def sdk_target() -> str:
    """The SQLite file path or Postgres DSN the SDK should open."""
    name = connection.settings_dict["NAME"]
    return name if connection.vendor == "sqlite" else catalog.pg_dsn(name)


def with_sdk(work):
    """Open a cairnq client on the test database, run `await work(client)`, close it."""
    from cairnq import CairnQ

    async def run():
        target = sdk_target()
        if connection.vendor == "sqlite":
            client = CairnQ.sqlite(target)
        else:
            client = CairnQ.postgres(target)
        await client.connect()
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(run())
