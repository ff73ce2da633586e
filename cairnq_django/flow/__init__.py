"""Flow control across the fleet: what holds a task back beyond the protocol's own run_at.

The state lives in models/flow.py (the app's own tables, not the protocol's): the
queue pause flags, each task's snooze count and concurrency key, the
runtime limits and the rate limits' start log. pausing.py pauses and resumes
queues (admin/queue_state_admin.py has the dashboard's buttons; the claim
honours the flags in store/protocol_statements.py, `_claimable`); snoozes.py
reads the snooze counts the admin shows; limits.py has the fleet-wide
concurrency and rate limits, limit_parsing.py their validation (the claim
honours them in store/limited_claim.py, counting through
store/limit_counts.py); backpressure.py makes enqueue wait while a queue is
at MAX_QUEUE_DEPTH.
"""
