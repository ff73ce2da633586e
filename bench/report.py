"""Render harness results as Markdown tables plus a target checklist."""

from __future__ import annotations

import re

NAMES = {
    "cairnq_django": "cairnq_django",
    "django_tasks_db": "django-tasks-db",
    "procrastinate": "Procrastinate",
    "cairnq": "cairnq 0.15.1",
    "celery": "Celery→Redis",
    "pgqueuer": "PgQueuer",
    "huey": "Huey",
    "django_q2": "django-q2",
    # Ours at another commit (`bench/run --baseline REF`), for before/after.
    "baseline": "ours at baseline",
}
PEERS = ["django_tasks_db", "procrastinate", "cairnq", "celery", "pgqueuer", "huey", "django_q2"]
# (workload, field, label, higher_is_better)
ROWS = [
    ("w1", "rate", "W1 enqueue one at a time (tasks/s)", True),
    ("w1b", "rate", "W1b bulk enqueue (tasks/s)", True),
    ("w2", "rate", "W2 drain, defaults (tasks/s)", True),
    ("w2t", "rate", "W2 drain, best setting (tasks/s)", True),
    ("w2", "xact_per_task", "W2 database transactions per task, defaults", False),
    ("w2", "cpu_us_per_task", "W2 worker CPU per task (µs, user+sys from spawn), defaults", False),
    ("w2t", "cpu_us_per_task", "W2 worker CPU per task (µs), best setting", False),
    ("w2", "first_done_s", "W2 spawn → first task done (s), defaults", False),
    ("w2", "sessions_per_worker", "W2 sessions per worker process (most at once), defaults", False),
    ("w3", "p50", "W3 pickup p50 (ms)", False),
    ("w3", "p95", "W3 pickup p95 (ms)", False),
    ("w3", "idle_cpu_pct", "W3 idle worker CPU (% of a core)", False),
    ("w4", "p50", "W4 call() round trip p50 (ms)", False),
    ("w4", "p95", "W4 call() round trip p95 (ms)", False),
    ("w6", "p50", "W6 lateness of delayed tasks, start − due, p50 (ms)", False),
    ("w6", "p95", "W6 lateness of delayed tasks, start − due, p95 (ms)", False),
]
MARKERS = {
    "SQLite": ("<!-- bench:sqlite:start -->", "<!-- bench:sqlite:end -->"),
    "PostgreSQL": ("<!-- bench:postgres:start -->", "<!-- bench:postgres:end -->"),
}


def _fmt(stat: dict, digits: int) -> str:
    return f"{stat['median']:,.{digits}f} ({stat['min']:,.{digits}f}–{stat['max']:,.{digits}f})"


def _digits(field: str, value: float) -> int:
    if field == "rate":
        return 0
    return 1 if value >= 10 else 2


def _cell(results: dict, backend: str, system: str, workload: str, args_prefix=None):
    for cell in results["cells"]:
        if (cell["backend"], cell["system"], cell["workload"]) != (backend, system, workload):
            continue
        if args_prefix and cell["args"][: len(args_prefix)] != args_prefix:
            continue
        return cell
    return None


def render(results: dict) -> str:
    out = [
        f"Run {results['started']} → {results['finished']} · {results['machine']} · "
        f"{results['reps']} repetitions per cell, median (min–max)",
        f"Command: `{results['command']}`",
        "",
    ]
    for backend, limit in results["limits"].items():
        systems = [s for s in NAMES if any(
            c["backend"] == backend and c["system"] == s for c in results["cells"])]
        out.append(f"### {'PostgreSQL' if backend == 'postgres' else 'SQLite'}")
        out.append("")
        out.append(
            f"Database limit (one client, single-row INSERT+COMMIT): "
            f"{_fmt(limit, 0)} commits/s"
        )
        row_limit = results.get("row_limits", {}).get(backend)
        if row_limit:
            out.append("")
            out.append(
                f"The protocol's task row alone (its ten indexes"
                f"{', the NOTIFY trigger' if backend == 'postgres' else ''}), same one client: "
                f"{_fmt(row_limit, 0)} commits/s"
            )
        out.append("")
        names = dict(NAMES, baseline=f"ours at {results.get('baseline')}")
        has_baseline = "baseline" in systems
        out.append("| workload | " + " | ".join(names[s] for s in systems)
                   + " | ours ÷ best peer | ours vs DB limit |"
                   + (" ours ÷ baseline |" if has_baseline else ""))
        out.append("|---" * (len(systems) + 3 + has_baseline) + "|")
        for workload, field, label, higher in ROWS:
            stats = {}
            for s in systems:
                cell = _cell(results, backend, s, workload)
                if cell and field in cell["summary"]:
                    stats[s] = cell["summary"][field]
            if not stats:
                continue
            row = [label]
            for s in systems:
                if s in stats:
                    text = _fmt(stats[s], _digits(field, stats[s]["median"]))
                    cell = _cell(results, backend, s, workload)
                    if workload == "w2t" and cell.get("setting"):
                        text += f" `{cell['setting']}`"
                    row.append(text)
                else:
                    row.append("—")
            ours = stats.get("cairnq_django", {}).get("median")
            peers = [stats[p]["median"] for p in PEERS if p in stats]
            ratio = "—"
            if ours and peers and field != "idle_cpu_pct":
                best = max(peers) if higher else min(peers)
                ratio = f"{(ours / best if higher else best / ours):.2f}×"
            versus = "—"
            if ours and field == "rate":
                versus = f"{ours / limit['median'] * 100:.0f}%"
            elif ours and field in ("p50", "p95"):
                versus = f"{ours / (1000 / limit['median']):.1f} commit times"
            extra = []
            if has_baseline:
                before = stats.get("baseline", {}).get("median")
                extra = [f"{(ours / before if higher else before / ours):.2f}×"
                         if ours and before and field != "idle_cpu_pct" else "—"]
            out.append("| " + " | ".join(row + [ratio, versus, *extra]) + " |")
        out.append("")
        w5 = [c for c in results["cells"] if c["backend"] == backend and c["workload"] == "w5"]
        if w5:
            out.append("W5 scale (cairnq_django, defaults):")
            out.append("")
            out.append("| rows already in the table | claim p50 (ms) | claim p95 (ms) | drain (tasks/s) |")
            out.append("|---|---|---|---|")
            for cell in w5:
                a = cell["args"]
                rows = int(a[a.index("--rows") + 1])
                kind = a[a.index("--filler") + 1]
                s = cell["summary"]
                out.append(
                    f"| {rows:,} {kind} | {_fmt(s['claim_p50'], 2)} | {_fmt(s['claim_p95'], 2)} |"
                    f" {_fmt(s['rate'], 0)} |"
                )
            out.append("")
    return "\n".join(out) + "\n"


def write_docs(path: str, table: str) -> None:
    """Replace each backend's block in docs/benchmarks.md with this run's section.

    A run that covered one backend leaves the other backend's block alone, so
    the two may come from separate runs; each block names its own run.
    """
    header, _, body = table.partition("### ")
    with open(path) as f:
        text = f.read()
    for section in ("### " + body).split("\n### "):
        section = section.removeprefix("### ")
        title = section.split("\n", 1)[0].strip()
        if title not in MARKERS:
            continue
        start, end = MARKERS[title]
        block = f"{start}\n### {title}\n\n{header.strip()}\n{section.split(chr(10), 1)[1].rstrip()}\n\n{end}"
        if start in text:
            pattern = re.escape(start) + ".*?" + re.escape(end)
            text = re.sub(pattern, lambda m, block=block: block, text, flags=re.S)
        else:
            text += "\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


README_MARKERS = ("<!-- bench:readme:start -->", "<!-- bench:readme:end -->")
BACKEND_TITLES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def render_summary(results: dict) -> str:
    """The README's table: ours beside the best peer, one column group per backend."""
    backends = list(results["limits"])
    out = [
        f"Run {results['started']} → {results['finished']} · {results['machine']} · "
        f"median of {results['reps']} · `{results['command']}`",
        "",
        "| workload | " + " | ".join(
            f"{BACKEND_TITLES[b]}: ours | best peer | vs best peer" for b in backends
        ) + " |",
        "|---" * (1 + 3 * len(backends)) + "|",
    ]
    for workload, field, label, higher in ROWS:
        row, any_value = [label], False
        for backend in backends:
            ours_cell = _cell(results, backend, "cairnq_django", workload)
            ours = ours_cell["summary"].get(field) if ours_cell else None
            peers = {}
            for peer in PEERS:
                cell = _cell(results, backend, peer, workload)
                if cell and field in cell["summary"]:
                    peers[peer] = cell["summary"][field]["median"]
            if ours is None:
                row += ["—", "—", "—"]
                continue
            any_value = True
            text = f"{ours['median']:,.{_digits(field, ours['median'])}f}"
            if workload == "w2t" and ours_cell.get("setting"):
                text += f" (`{ours_cell['setting']}`)"
            row.append(text)
            if not peers:
                row += ["—", "—"]
                continue
            best = (max if higher else min)(peers, key=peers.get)
            value = peers[best]
            row.append(f"{value:,.{_digits(field, value)}f} ({NAMES[best]})")
            if field == "idle_cpu_pct":
                row.append("—")
            else:
                ratio = ours["median"] / value if higher else value / ours["median"]
                row.append(f"{ratio:.2f}×")
        if any_value:
            out.append("| " + " | ".join(row) + " |")
    out.append(
        "| database limit, one client (commits/s) | "
        + " | ".join(f"{results['limits'][b]['median']:,.0f} | | " for b in backends)
        + "|"
    )
    return "\n".join(out) + "\n"


def write_readme(path: str, results: dict) -> None:
    """Replace the README's results table between its markers with this run's summary."""
    start, end = README_MARKERS
    with open(path) as f:
        text = f.read()
    if start not in text:
        return
    block = f"{start}\n{render_summary(results).rstrip()}\n{end}"
    text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    with open(path, "w") as f:
        f.write(text)
