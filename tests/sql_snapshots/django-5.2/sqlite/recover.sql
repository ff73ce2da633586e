-- the lease recovery: expired leases requeued or failed
-- parameters, in order: 'canceled', 'queued', 'failed', Slot('now_ms', row=None), Slot('lease_error', row=None), Slot('now_ms', row=None), Slot('now_ms', row=None), Slot('now_ms', row=None)
UPDATE "cairnq_tasks"
SET "status" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NOT NULL) THEN %(p0)s
WHEN ("cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN %(p1)s
ELSE %(p2)s END, "worker_id" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN NULL
ELSE "cairnq_tasks"."worker_id" END, "lease_until_ms" = NULL, "run_at_ms" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN %(p3)s
ELSE "cairnq_tasks"."run_at_ms" END, "error" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" >= ("cairnq_tasks"."max_attempts")) THEN %(p4)s
ELSE "cairnq_tasks"."error" END, "completed_at_ms" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN "cairnq_tasks"."completed_at_ms"
ELSE %(p5)s END, "progress" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN NULL
ELSE "cairnq_tasks"."progress" END, "message" = CASE
WHEN ("cairnq_tasks"."cancel_requested_at_ms" IS NULL
AND "cairnq_tasks"."attempt" < ("cairnq_tasks"."max_attempts")) THEN NULL
ELSE "cairnq_tasks"."message" END, "updated_at_ms" = %(p6)s
WHERE "cairnq_tasks"."id" IN (SELECT U0."id" AS "id"
FROM "cairnq_tasks" U0
WHERE (U0."status" = 'running'
AND U0."lease_until_ms" IS NOT NULL
AND U0."lease_until_ms" <= (%(p7)s)))
RETURNING "cairnq_tasks"."id", "cairnq_tasks"."name", "cairnq_tasks"."queue", "cairnq_tasks"."status", CAST("cairnq_tasks"."payload" AS BLOB), CAST("cairnq_tasks"."result" AS BLOB), CAST("cairnq_tasks"."error" AS BLOB), CAST("cairnq_tasks"."metadata" AS BLOB), "cairnq_tasks"."progress", CAST("cairnq_tasks"."message" AS BLOB), "cairnq_tasks"."attempt", "cairnq_tasks"."max_attempts", "cairnq_tasks"."priority", "cairnq_tasks"."worker_id", "cairnq_tasks"."lease_until_ms", "cairnq_tasks"."run_at_ms", "cairnq_tasks"."cancel_requested_at_ms", "cairnq_tasks"."parent_id", "cairnq_tasks"."root_id", "cairnq_tasks"."correlation_id", "cairnq_tasks"."created_at_ms", "cairnq_tasks"."updated_at_ms", "cairnq_tasks"."completed_at_ms"
