-- the claim: one queue, one task name, up to 10 tasks
-- parameters, in order: 'running', Slot('worker_id', row=None), Slot('now_ms', row=None), Slot('lease_ms', row=None), 1, Slot('now_ms', row=None), Slot('q0', row=None), Slot('n0', row=None), Slot('now_ms', row=None)
UPDATE "cairnq_tasks"
SET "status" = %(p0)s, "worker_id" = %(p1)s, "lease_until_ms" = (%(p2)s + %(p3)s), "attempt" = ("cairnq_tasks"."attempt" + %(p4)s), "updated_at_ms" = %(p5)s
WHERE "cairnq_tasks"."id" IN (SELECT V0."id" AS "id"
FROM "cairnq_tasks" V0
WHERE (V0."queue" = (%(p6)s)
AND V0."name" = (%(p7)s)
AND V0."status" = 'queued'
AND V0."run_at_ms" <= (%(p8)s)
AND NOT (V0."queue" IN (SELECT U0."queue" AS "queue"
FROM "cairnq_django_queue_state" U0
WHERE U0."paused")))
ORDER BY V0."priority" DESC, V0."run_at_ms" ASC, 1 ASC
LIMIT 10)
RETURNING "cairnq_tasks"."id", "cairnq_tasks"."name", "cairnq_tasks"."queue", "cairnq_tasks"."status", CAST("cairnq_tasks"."payload" AS BLOB), CAST("cairnq_tasks"."result" AS BLOB), CAST("cairnq_tasks"."error" AS BLOB), CAST("cairnq_tasks"."metadata" AS BLOB), "cairnq_tasks"."progress", CAST("cairnq_tasks"."message" AS BLOB), "cairnq_tasks"."attempt", "cairnq_tasks"."max_attempts", "cairnq_tasks"."priority", "cairnq_tasks"."worker_id", "cairnq_tasks"."lease_until_ms", "cairnq_tasks"."run_at_ms", "cairnq_tasks"."cancel_requested_at_ms", "cairnq_tasks"."parent_id", "cairnq_tasks"."root_id", "cairnq_tasks"."correlation_id", "cairnq_tasks"."created_at_ms", "cairnq_tasks"."updated_at_ms", "cairnq_tasks"."completed_at_ms"
