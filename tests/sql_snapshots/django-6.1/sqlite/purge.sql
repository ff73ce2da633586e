-- the purge: up to 100 finished tasks of one queue
-- parameters, in order: Slot('queue', row=None), Slot('now_ms', row=None), Slot('older_than_ms', row=None)
DELETE
FROM "cairnq_tasks"
WHERE "cairnq_tasks"."id" IN (SELECT "U0"."id" AS "id"
FROM "cairnq_tasks" "U0"
WHERE ("U0"."status" IN ('succeeded', 'failed', 'canceled')
AND "U0"."queue" = (%(p0)s)
AND "U0"."completed_at_ms" IS NOT NULL
AND "U0"."completed_at_ms" < (%(p1)s - %(p2)s))
ORDER BY "U0"."completed_at_ms" ASC
LIMIT 100)
RETURNING "cairnq_tasks"."id", "cairnq_tasks"."completed_at_ms"
