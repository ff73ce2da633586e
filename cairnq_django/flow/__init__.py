"""Flow control across the fleet: pause and resume a queue.

models.py holds the state (the app's own table, not the protocol's);
pausing.py the operations; admin/queue_state_admin.py the dashboard's buttons. The claim honours
the state in store/protocol_statements.py (`_claimable`).
"""
