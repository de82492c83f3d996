"""Self-contained HTML report of an evaluation (opens from disk: inline CSS + SVG, no scripts from the network).

Sections: the cell table (accuracy with Wilson intervals, valid-action rate, outcomes, the scoring mode that judged the
cell and its unjudged tasks, the tasks that ran with missing media), planner prompt tokens per step for each cell (the
context-flatness plot), outcomes, tool distribution, need closure, and a per-task viewer that shows for each step what
the planner saw, what it did, the critic verdict and the ledger diff."""

from __future__ import annotations

import html
import json
from pathlib import Path

from collect.ledger import OUTCOMES

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
pre{background:#f8f8f8;border:1px solid #eee;padding:6px;white-space:pre-wrap;font-size:11px;
    max-height:320px;overflow:auto}
details{margin:4px 0} summary{cursor:pointer} .ok{color:#2a7} .bad{color:#c33} .muted{color:#777;font-size:12px}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def line_chart(series: dict[str, dict[str, float]], title: str, ylabel: str, w=560, h=260) -> str:
    """series: name -> {x(str int): y}. Returns an inline SVG."""
    pts = [(int(x), y) for s in series.values() for x, y in s.items() if y is not None]
    if not pts:
        return f"<p class='muted'>{_e(title)}: no data</p>"
    xmax = max(p[0] for p in pts) or 1
    ymax = max(p[1] for p in pts) or 1
    pad = 44
    sx = lambda x: pad + (w - pad - 10) * (x - 1) / max(1, xmax - 1)  # noqa: E731
    sy = lambda y: h - pad + 10 - (h - pad - 10) * y / ymax  # noqa: E731
    out = [f"<svg width='{w}' height='{h}' role='img' aria-label='{_e(title)}'>"]
    out.append(f"<text x='{w / 2}' y='14' text-anchor='middle' font-size='13'>{_e(title)}</text>")
    out.append(f"<line x1='{pad}' y1='{h - pad + 10}' x2='{w - 10}' y2='{h - pad + 10}' stroke='#999'/>")
    out.append(f"<line x1='{pad}' y1='20' x2='{pad}' y2='{h - pad + 10}' stroke='#999'/>")
    for k in range(0, 5):
        yv = ymax * k / 4
        out.append(f"<text x='{pad - 4}' y='{sy(yv) + 4:.1f}' text-anchor='end' font-size='10'>{yv:.0f}</text>")
    for x in range(1, xmax + 1):
        out.append(f"<text x='{sx(x):.1f}' y='{h - pad + 24}' text-anchor='middle' font-size='10'>{x}</text>")
    out.append(f"<text x='{w / 2}' y='{h - 4}' text-anchor='middle' font-size='11'>planner step</text>")
    out.append(
        f"<text x='12' y='{h / 2}' font-size='11' transform='rotate(-90 12 {h / 2})' text-anchor='middle'>"
        f"{_e(ylabel)}</text>"
    )
    for i, s in enumerate(series.values()):
        c = PALETTE[i % len(PALETTE)]
        xy = sorted((int(x), y) for x, y in s.items() if y is not None)
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in xy)
        out.append(f"<polyline fill='none' stroke='{c}' stroke-width='2' points='{path}'/>")
        for x, y in xy:
            out.append(f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2.5' fill='{c}'/>")
    out.append("</svg>")
    legend = "".join(
        f"<span><i class='sw' style='background:{PALETTE[i % len(PALETTE)]}'></i>{_e(n)}</span>"
        for i, n in enumerate(series)
    )
    return "".join(out) + f"<div class='legend'>{legend}</div>"


def bar_chart(values: dict[str, float], title: str, w=560, bar_h=16, fmt=lambda v: f"{v:g}") -> str:
    if not values:
        return f"<p class='muted'>{_e(title)}: no data</p>"
    vmax = max(values.values()) or 1
    label_w = 180
    h = 24 + bar_h * len(values) + 4 * len(values)
    out = [f"<svg width='{w}' height='{h}' role='img' aria-label='{_e(title)}'>"]
    out.append(f"<text x='0' y='14' font-size='13'>{_e(title)}</text>")
    for i, (k, v) in enumerate(values.items()):
        y = 22 + i * (bar_h + 4)
        bw = (w - label_w - 60) * v / vmax
        out.append(f"<text x='{label_w - 6}' y='{y + bar_h - 4}' text-anchor='end' font-size='11'>{_e(k)}</text>")
        out.append(f"<rect x='{label_w}' y='{y}' width='{bw:.1f}' height='{bar_h}' fill='{PALETTE[0]}'/>")
        out.append(f"<text x='{label_w + bw + 4:.1f}' y='{y + bar_h - 4}' font-size='11'>{_e(fmt(v))}</text>")
    out.append("</svg>")
    return "".join(out)


def _ledger_diff(before: dict | None, after: dict | None) -> list[str]:
    """Human-readable changes between two ledger snapshots (needs, atoms, conflicts)."""
    if not after:
        return []
    before = before or {}
    lines = []
    old_needs = {n["index"]: n for n in before.get("needs", [])}
    for n in after.get("needs", []):
        o = old_needs.get(n["index"])
        if o is None:
            lines.append(f"+ need {n['index']}: {n['need']} [{n['status']}]")
            continue
        if (o["status"], o.get("value")) != (n["status"], n.get("value")):
            lines.append(
                f"~ need {n['index']}: {o['status']}->{n['status']} value {o.get('value')!r}->{n.get('value')!r}"
            )
    old_atoms = {a["id"] for a in before.get("atoms", [])}
    for a in after.get("atoms", []):
        if a["id"] not in old_atoms:
            lines.append(f"+ atom {a['id']} need {a['need_index']} = {a['value']!r} ({a['source']})")
    old_c = {c["id"]: c for c in before.get("conflicts", [])}
    for c in after.get("conflicts", []):
        oc = old_c.get(c["id"])
        if oc is None:
            lines.append(f"+ conflict {c['id']}: {c['description']}")
        elif c["resolved"] and not oc["resolved"]:
            lines.append(f"✓ conflict {c['id']} resolved by {c['resolved_by']}")
    return lines


def task_viewer(records: list[dict], max_tasks: int = 60, max_chars: int = 4000) -> str:
    out = []
    for r in records[:max_tasks]:
        ok = r.get("correct")
        cls = "ok" if ok else "bad"
        head = (
            f"<span class='{cls}'>{'✓' if ok else '✗'}</span> {_e(r['task_id'])} · {_e(r.get('outcome'))} · "
            f"answer {_e(r.get('answer'))!s} · gold {_e(r.get('gold_answer'))}"
        )
        body = [f"<p>{_e(r.get('question', ''))}</p>"]
        steps = r.get("steps", [])
        for i, s in enumerate(steps):
            after = steps[i + 1].get("ledger_before") if i + 1 < len(steps) else r.get("final_ledger")
            msgs = s.get("planner_input", {}).get("messages", [])
            seen = "\n\n".join(f"[{m.get('role')}]\n{m.get('content') or ''}" for m in msgs)
            act = s.get("action")
            verdict = s.get("verdict") or {}
            diff = _ledger_diff(s.get("ledger_before"), after)
            resolved = s.get("resolved_arguments")  # value references (runtime.value_refs): what the tool got
            resolved_html = (
                f"<b>resolved arguments</b><pre>{_e(json.dumps(resolved, ensure_ascii=False)[:1500])}</pre>"
                if resolved
                else ""
            )
            body.append(
                f"<details><summary>step {s.get('t')}: "
                f"{_e(json.dumps(act, ensure_ascii=False) if act else 'no valid action')} "
                f"<span class='muted'>{_e(verdict.get('verdict', ''))} · {s.get('prompt_tokens', 0)} prompt tokens"
                f"</span></summary>"
                f"<b>planner saw</b><pre>{_e(seen[:max_chars])}</pre>"
                f"<b>planner output</b><pre>{_e(json.dumps(s.get('planner_output'), ensure_ascii=False)[:1500])}</pre>"
                f"{resolved_html}"
                f"<b>observation</b><pre>{_e(str(s.get('raw_observation', ''))[:1500])}</pre>"
                f"<b>verdict</b><pre>{_e(json.dumps(verdict, ensure_ascii=False)[:1500])}</pre>"
                f"<b>ledger diff</b><pre>{_e(chr(10).join(diff) or '(no change)')}</pre></details>"
            )
        out.append(f"<details class='task'><summary>{head}</summary>{''.join(body)}</details>")
    more = len(records) - max_tasks
    if more > 0:
        out.append(f"<p class='muted'>{more} more tasks in trajectories.jsonl</p>")
    return "".join(out)


def planners_table(planners: dict[str, dict]) -> str:
    """One row per planner with its seeds pooled (serve.eval.pool_planners), held-out-state figures beside it."""
    if not planners:
        return ""
    rows = []
    for key, p in planners.items():
        ci, h = p.get("ci95") or [None, None], p.get("heldout") or {}
        ans, una = p.get("answerable") or {}, p.get("unanswerable") or {}
        seeds = ", ".join(_pct(a) for a in p.get("seed_accuracies", []))
        tw = p.get("time_windows") or {}
        rows.append(
            f"<tr><td>{_e(key)}</td><td>{p.get('n_seeds')}</td><td>{p.get('n_task_runs')}</td>"
            f"<td>{_pct(p.get('accuracy'))}</td><td>{_pct(ci[0])}–{_pct(ci[1])}</td><td>{_e(seeds)}</td>"
            f"<td>{_pct(ans.get('accuracy'))} ({ans.get('correct', 0)}/{ans.get('n', 0)})</td>"
            f"<td>{_pct(una.get('rate'))} ({una.get('insufficient', 0)}/{una.get('n', 0)}; "
            f"{una.get('declared_insufficient', 0)} declared)</td>"
            f"<td>{_pct(p.get('valid_action_rate'))} ({p.get('tasks_with_rejected_reply', 0)} runs; "
            f"max {p.get('most_rejected_in_one_task', 0)})</td>"
            f"<td>{_pct(tw.get('window_match_rate'))} ({tw.get('window_matches', 0)}/{tw.get('windowed_calls', 0)}; "
            f"{tw.get('tasks_with_wrong_window', 0)} runs off)</td>"
            + "".join(f"<td>{p.get('outcomes', {}).get(o, 0)}</td>" for o in OUTCOMES)
            + f"<td>{_pct(h.get('valid'))}</td><td>{_pct(h.get('reference_tool_match'))}</td>"
            f"<td>{_pct(h.get('reference_query_match'))}</td><td>{_pct(h.get('compute'))}</td></tr>"
        )
    return (
        "<h2>Planners (seeds pooled)</h2><table><tr><th>planner</th><th>seeds</th><th>task runs</th><th>accuracy</th>"
        "<th>95% CI</th><th>per seed</th><th>answerable acc.</th><th>unanswerable → insufficient</th>"
        "<th>valid own steps (runs with a rejected reply; most in one run)</th>"
        "<th>time window copied (calls; runs with a wrong one)</th>"
        + "".join(f"<th>{o}</th>" for o in OUTCOMES)
        + "<th>held-out valid</th><th>held-out same tool</th><th>held-out same query</th>"
        "<th>held-out right program</th></tr>"
        + "".join(rows)
        + "</table><p class='muted'>held-out: greedy decisions on teacher-visited states of unseen tasks "
        "(rl.score), mean over seeds; same query: the teacher's query string exactly, on states whose teacher "
        "call has one (it is built from the need's query_focus); right program: on states whose teacher call is a "
        "program, the greedy decision is a program that prints the same value (rewards.execution); '-' = not scored "
        "(teacher, or no heldout in the "
        'eval config). Time window copied: perception calls on a need whose focus names a window ("between 35 s '
        'and 50 s") that pass that window as time_range (collect.summary.window_stats). '
        "Unanswerable tasks end 'insufficient' when the budget runs out too; 'declared' counts the runs that stopped "
        "with outcome insufficient.</p>"
    )


def render_report(
    title: str, cells: dict[str, dict], records: dict[str, list[dict]], planners: dict[str, dict] | None = None
) -> str:
    """cells: cell name -> summary dict; records: cell name -> trajectory records; planners: seeds pooled."""
    rows = []
    for name, s in cells.items():
        oc = s.get("outcomes", {})
        ci = s.get("ci95") or [None, None]
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{s.get('n_tasks')}</td><td>{_pct(s.get('accuracy'))}</td>"
            f"<td>{_pct(ci[0])}–{_pct(ci[1])}</td><td>{_pct(s.get('valid_action_rate'))}</td>"
            + "".join(f"<td>{oc.get(o, 0)}</td>" for o in OUTCOMES)
            + f"<td>{s.get('avg_tool_calls') or 0:.2f}</td>"
            + f"<td>{_e(s.get('scoring_mode') or '-')}</td><td>{s.get('n_unjudged', 0)}</td>"
            + f"<td>{s.get('n_missing_media', 0)}</td></tr>"
        )
    table = (
        "<table><tr><th>cell</th><th>tasks</th><th>accuracy</th><th>95% CI</th><th>valid actions</th>"
        + "".join(f"<th>{o}</th>" for o in OUTCOMES)
        + "<th>avg tool calls</th><th>scoring</th><th>unjudged</th><th>missing media</th></tr>"
        + "".join(rows)
        + "</table>"
    )
    notes = [
        f"<p class='bad'>{_e(name)}: {s['n_missing_media']} task(s) ran with missing media files "
        f"(allow_missing_media; their perception saw no media): {_e(', '.join(s.get('missing_media_tasks', [])[:20]))}"
        + (" ..." if len(s.get("missing_media_tasks", [])) > 20 else "")
        + "</p>"
        for name, s in cells.items()
        if s.get("n_missing_media")
    ]
    table += "".join(notes)
    # a planner that reports no token counts (the offline teacher) is left out, not drawn as a line at 0
    series = {n: s.get("planner_prompt_tokens_by_step", {}) for n, s in cells.items()}
    counted = {n: v for n, v in series.items() if any((y or 0) > 0 for y in v.values())}
    tokens = line_chart(counted, "planner prompt tokens per call, by step", "tokens")
    if len(counted) < len(series):
        left = ", ".join(n for n in series if n not in counted)
        tokens += f"<p class='muted'>left out (no token counts): {_e(left)}</p>"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"]
    parts.append(f"</head><body><h1>{_e(title)}</h1>{planners_table(planners or {})}<h2>Summary</h2>{table}")
    parts.append(f"<h2>Context per planner call</h2>{tokens}")
    parts.append("<h2>Outcomes, tools and need closure</h2>")
    for name, s in cells.items():
        closure = s.get("closure_audit", {})
        parts.append(f"<h3>{_e(name)}</h3>")
        parts.append(bar_chart({o: s.get("outcomes", {}).get(o, 0) for o in OUTCOMES}, "outcomes"))
        parts.append(bar_chart(s.get("tool_distribution", {}), "tool calls"))
        parts.append(
            bar_chart(
                {k: (v.get("filled_share") or 0.0) for k, v in closure.items()},
                "share of declared needs filled (correct vs incorrect runs)",
                fmt=lambda v: f"{100 * v:.0f}%",
            )
        )
        acc = {f"{k}": (v.get("accuracy") or 0.0) for k, v in s.get("by_difficulty", {}).items()}
        parts.append(bar_chart(acc, "accuracy by difficulty", fmt=lambda v: f"{100 * v:.0f}%"))
    parts.append("<h2>Per-task viewer</h2>")
    for name, recs in records.items():
        parts.append(f"<details><summary><b>{_e(name)}</b> ({len(recs)} tasks)</summary>{task_viewer(recs)}</details>")
    parts.append("</body></html>")
    return "".join(parts)


def write_report(
    path: str | Path,
    title: str,
    cells: dict[str, dict],
    records: dict[str, list[dict]],
    planners: dict[str, dict] | None = None,
) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_report(title, cells, records, planners), encoding="utf-8")
    tmp.replace(path)
    return path
