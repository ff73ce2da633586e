"""Flow control across the fleet: pause and resume a queue.

models.py holds the state (the app's own table, not the protocol's);
pausing.py the operations; admin.py the dashboard's buttons. The claim honours
the state in store/queries.py (`_claimable`).
"""
