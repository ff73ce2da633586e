"""Periodic tasks without a leader: cron and interval schedules shared by every worker.

settings.CAIRNQ['SCHEDULE'] names the schedules (config.py); a small table
holds where each one has got to (models/schedules.py); every worker runs a Scheduler
thread (scheduler.py) that enqueues a due occurrence and advances that table by
compare-and-set in the same transaction (state.py), so each occurrence is
enqueued once however many workers are alive.
"""
