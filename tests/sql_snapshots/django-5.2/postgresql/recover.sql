-- the lease recovery: expired leases requeued or failed
-- parameters, in order: 'canceled', 'queued', 'failed', Slot('lease_error', row=None)
UPDATE "cairnq_tasks"
SET "status" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NOT NULL) THEN %s
WHEN ("cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN %s
ELSE %s END, "worker_id" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN NULL
ELSE "cairnq_tasks"."worker_id" END, "lease_until_ms" = NULL, "run_at_ms" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN (extract(epoch from statement_timestamp()) * 1000)::bigint
ELSE "cairnq_tasks"."run_at_ms" END, "error" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" >= ("cairnq_tasks"."max_attempts")) THEN %s::jsonb
ELSE "cairnq_tasks"."error" END, "completed_at_ms" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN "cairnq_tasks"."completed_at_ms"
ELSE (extract(epoch from statement_timestamp()) * 1000)::bigint END, "progress" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN NULL
ELSE "cairnq_tasks"."progress" END, "message" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN NULL
ELSE "cairnq_tasks"."message" END, "updated_at_ms" = (extract(epoch from statement_timestamp()) * 1000)::bigint
WHERE "cairnq_tasks"."id" IN (SELECT U0."id" AS "id"
FROM "cairnq_tasks" U0
WHERE (U0."status" = 'running'
AND U0."lease_until_ms" IS NOT NULL
AND U0."lease_until_ms" <= (extract(epoch from statement_timestamp()) * 1000)::bigint)
FOR UPDATE SKIP LOCKED)
RETURNING "cairnq_tasks"."id", "cairnq_tasks"."name", "cairnq_tasks"."queue", "cairnq_tasks"."status", "cairnq_tasks"."payload", "cairnq_tasks"."result", "cairnq_tasks"."error", "cairnq_tasks"."metadata", "cairnq_tasks"."progress", "cairnq_tasks"."message", "cairnq_tasks"."attempt", "cairnq_tasks"."max_attempts", "cairnq_tasks"."priority", "cairnq_tasks"."worker_id", "cairnq_tasks"."lease_until_ms", "cairnq_tasks"."run_at_ms", "cairnq_tasks"."cancel_requested_at_ms", "cairnq_tasks"."parent_id", "cairnq_tasks"."root_id", "cairnq_tasks"."correlation_id", "cairnq_tasks"."created_at_ms", "cairnq_tasks"."updated_at_ms", "cairnq_tasks"."completed_at_ms"
