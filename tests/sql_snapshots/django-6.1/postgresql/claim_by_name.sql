-- the claim: one queue, one task name, up to 10 tasks
-- parameters, in order: 'running', Slot('worker_id', row=None), Slot('lease_ms', row=None), Int4(1), Slot('q0', row=None), Slot('n0', row=None)
UPDATE "cairnq_tasks"
SET "status" = %s, "worker_id" = %s, "lease_until_ms" = ((extract(epoch from statement_timestamp()) * 1000)::bigint + %s), "attempt" = ("cairnq_tasks"."attempt" + %s), "updated_at_ms" = (extract(epoch from statement_timestamp()) * 1000)::bigint
WHERE "cairnq_tasks"."id" IN (SELECT "V0"."id" AS "id"
FROM "cairnq_tasks" "V0"
WHERE ("V0"."queue" = (%s)
AND "V0"."name" = (%s)
AND "V0"."status" = 'queued'
AND "V0"."run_at_ms" <= (extract(epoch from statement_timestamp()) * 1000)::bigint
AND NOT ("V0"."queue" IN (SELECT "U0"."queue" AS "queue"
FROM "cairnq_django_queue_state" "U0"
WHERE "U0"."paused")))
ORDER BY "V0"."priority" DESC, "V0"."run_at_ms" ASC, 1 ASC
LIMIT 10
FOR UPDATE SKIP LOCKED)
RETURNING "cairnq_tasks"."id", "cairnq_tasks"."name", "cairnq_tasks"."queue", "cairnq_tasks"."status", "cairnq_tasks"."payload", "cairnq_tasks"."result", "cairnq_tasks"."error", "cairnq_tasks"."metadata", "cairnq_tasks"."progress", "cairnq_tasks"."message", "cairnq_tasks"."attempt", "cairnq_tasks"."max_attempts", "cairnq_tasks"."priority", "cairnq_tasks"."worker_id", "cairnq_tasks"."lease_until_ms", "cairnq_tasks"."run_at_ms", "cairnq_tasks"."cancel_requested_at_ms", "cairnq_tasks"."parent_id", "cairnq_tasks"."root_id", "cairnq_tasks"."correlation_id", "cairnq_tasks"."created_at_ms", "cairnq_tasks"."updated_at_ms", "cairnq_tasks"."completed_at_ms"
