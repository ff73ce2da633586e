"""A `cairnq` 0.15.1 SDK process for the interop tests (no Django in here).

Usage: python tests/interop_sdk.py ACTION TARGET JSON_ARGS

TARGET is a SQLite file path or a postgresql:// DSN. Prints one JSON document.

Actions:
  submit  {"tasks": [{"name", "payload", "queue"?, "max_attempts"?, "key"?}]} -> {"ids": [...]}
  read    {"ids": [...]} -> {"tasks": {id: {status, result, error, attempt, worker_id}}}
  work    {"ids": [...], "queues": [...], "timeout": s} -> run an SDK worker until every
          id is terminal, then {"tasks": ...} as for read
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from cairnq import CairnQ, TaskError, Worker


def _client(target: str) -> CairnQ:
    if target.startswith("postgresql://"):
        return CairnQ.postgres(target, max_size=2)
    return CairnQ.sqlite(target)


def _describe(task) -> dict:
    return {
        "name": task.name,
        "status": task.status,
        "result": task.result,
        "error": task.error,
        "attempt": task.attempt,
        "worker_id": task.worker_id,
        "progress": task.progress,
        "message": task.message,
    }


async def _read(client: CairnQ, ids: list[str]) -> dict:
    tasks = {}
    for task_id in ids:
        task = await client.get(task_id)
        tasks[task_id] = None if task is None else _describe(task)
    return {"tasks": tasks}


async def submit(client: CairnQ, args: dict) -> dict:
    ids = []
    for spec in args["tasks"]:
        task = await client.submit(
            spec["name"],
            spec.get("payload"),
            queue=spec.get("queue", "default"),
            max_attempts=spec.get("max_attempts", 3),
            key=spec.get("key"),
        )
        ids.append(task.id)
    return {"ids": ids}


def _worker(target: str, queues: list[str]) -> Worker:
    if target.startswith("postgresql://"):
        worker = Worker.postgres(target, queues=queues, concurrency=2, max_size=3,
                                 poll_interval_ms=100)
    else:
        worker = Worker.sqlite(target, queues=queues, concurrency=2, poll_interval_ms=100)

    @worker.task("interop.add")
    async def add(ctx, payload):
        await ctx.progress(0.5, "adding")
        return {"sum": payload["a"] + payload["b"], "by": "sdk"}

    @worker.task("interop.boom")
    def boom(ctx, payload):
        raise ValueError(f"boom: {payload['why']}")

    @worker.task("interop.reject")
    async def reject(ctx, payload):
        raise TaskError(
            "The SDK handler rejects this input.",
            code="sdk_rejected",
            details={"input": payload},
        )

    return worker


async def work(client: CairnQ, target: str, args: dict) -> dict:
    worker = _worker(target, args["queues"])
    deadline = time.monotonic() + args.get("timeout", 60)
    async with worker.background():
        while True:
            state = await _read(client, args["ids"])
            if all(
                t is not None and t["status"] in ("succeeded", "failed", "canceled")
                for t in state["tasks"].values()
            ):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"The SDK worker did not finish the tasks in time: {state}")
            await asyncio.sleep(0.05)
    return state


async def main(action: str, target: str, args: dict) -> dict:
    client = _client(target)
    await client.connect()
    try:
        if action == "submit":
            return await submit(client, args)
        if action == "read":
            return await _read(client, args["ids"])
        if action == "work":
            return await work(client, target, args)
        raise SystemExit(f"Unknown action {action!r}.")
    finally:
        await client.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
