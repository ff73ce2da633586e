"""A workflow's graph as server-side SVG: steps in layers by depth, coloured by state, linked to their tasks.

Every name in the drawing is escaped (format_html); a layer wider than
MAX_PER_LAYER is cut with a "+N more" box, so a fan-out of thousands
still draws in a page's width.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from ...workflows.reads import StepState

MAX_PER_LAYER = 30
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 150, 30, 20, 60, 10
STATE_COLOURS = {
    "waiting": "#9e9e9e", "queued": "#1565c0", "running": "#f9a825",
    "succeeded": "#2e7d32", "failed": "#c62828", "canceled": "#8d6e63",
}


def depths(names: Sequence[str], parents: dict[str, list[str]]) -> dict[str, int]:
    """Each step's layer: one below its deepest parent (the graph is acyclic, enqueue() checked)."""
    depth: dict[str, int] = {}
    for name in names:  # steps come in insertion order; a parent may come later (after="x")
        stack = [name]
        while stack:
            current = stack[-1]
            missing = [p for p in parents.get(current, []) if p not in depth]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            depth[current] = 1 + max((depth[p] for p in parents.get(current, [])), default=-1)
    return depth


def graph_svg(
    steps: Sequence[StepState], parents: dict[str, list[str]], task_url: Callable[[str], str]
) -> SafeString:
    """The SVG of the steps; `parents` maps a step name to its parents' names."""
    depth = depths([s.name for s in steps], parents)
    layers: dict[int, list[StepState]] = defaultdict(list)
    for step in steps:
        layers[depth[step.name]].append(step)
    position: dict[str, tuple[int, int]] = {}
    boxes: list[SafeString] = []
    widest = 1
    for level in sorted(layers):
        shown = layers[level][:MAX_PER_LAYER]
        hidden = len(layers[level]) - len(shown)
        widest = max(widest, len(shown) + (1 if hidden else 0))
        y = PAD + level * (BOX_H + GAP_Y)
        for column, step in enumerate(shown):
            x = PAD + column * (BOX_W + GAP_X)
            position[step.name] = (x, y)
            boxes.append(_box(step, x, y, task_url))
        if hidden:
            x = PAD + len(shown) * (BOX_W + GAP_X)
            boxes.append(format_html(
                '<g class="cq-wf-more"><rect x="{}" y="{}" width="{}" height="{}" rx="4" fill="#eeeeee" '
                'stroke="#757575"/><text x="{}" y="{}" font-size="12">+{} more</text></g>',
                x, y, BOX_W, BOX_H, x + 8, y + 19, hidden,
            ))
    lines = [
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#9e9e9e" marker-end="url(#cq-arrow)"/>',
            position[parent][0] + BOX_W // 2, position[parent][1] + BOX_H,
            position[child][0] + BOX_W // 2, position[child][1],
        )
        for child, names in parents.items() if child in position
        for parent in names if parent in position
    ]
    width = PAD * 2 + widest * (BOX_W + GAP_X)
    height = PAD * 2 + (max(layers, default=0) + 1) * (BOX_H + GAP_Y)
    head = format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="cq-wf-graph" width="{}" height="{}" '
        'viewBox="0 0 {} {}" role="img" aria-label="workflow graph"><defs><marker id="cq-arrow" '
        'viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#9e9e9e"/></marker></defs>',
        width, height, width, height,
    )
    return mark_safe(head + "".join(lines) + "".join(boxes) + "</svg>")  # noqa: S308 - parts escaped


def _box(step: StepState, x: int, y: int, task_url: Callable[[str], str]) -> SafeString:
    colour = STATE_COLOURS.get(step.state, "#9e9e9e")
    label = step.name if len(step.name) <= 20 else step.name[:19] + "…"
    box = format_html(
        '<rect x="{}" y="{}" width="{}" height="{}" rx="4" fill="{}"/>'
        '<text x="{}" y="{}" font-size="12" fill="#ffffff">{}</text>'
        "<title>{} ({}: {})</title>",
        x, y, BOX_W, BOX_H, colour, x + 8, y + 19, label, step.name, step.task_name, step.state,
    )
    if step.task_id:
        return format_html(
            '<a href="{}" class="cq-wf-step cq-wf-{}">{}</a>', task_url(step.task_id), step.state, box
        )
    return format_html('<g class="cq-wf-step cq-wf-{}">{}</g>', step.state, box)
