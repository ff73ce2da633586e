"""Flow control: what holds a task back beyond the protocol's own run_at (issue 23)."""
