"""Workflows: steps that run after other steps, released in the transaction that settles their parents.

Submodules: `models` (the tables), `builder` (Workflow, add, map, enqueue and
its checks), `release` (the count-down in a parent's settle transaction),
`control` (cancel, retry, the sweeper's backstop), `reads` (get_workflow,
wait_workflow, ctx.parents), `shorthands` (chain, group, chord). Nothing is
imported here: Django imports `models` before its app registry is ready.
"""

# The reserved key of a step's task metadata: {"workflow": id, "step": step pk}.
# A worker tells a step from a plain task by this key on the row it claimed,
# so a plain task's settle costs no extra statement.
STEP_KEY = "cairnq_workflow"
