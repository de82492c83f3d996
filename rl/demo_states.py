"""A small rl_states dataset built directly with the ledger reducer, for tests and the CPU demo.

Why: RL must be testable before (and without) a collect run. Every state here is a real ledger snapshot produced by
collect.ledger.reduce from NeedsDeclared + ObservationCommitted events, in the harvest's rl_states row format:
{"prompt", "tools", "tool_names", "reference_action", "ledger", "digest", "question", "gold_answer", "task_id",
"step"}.
Each task contributes its states at successive decision steps (open anchor need -> open dependent need -> ready ->
finish), plus one state with an unresolved value conflict, so premature finishes and re-targeting are both present.

    python -m rl.demo_states --out runs/demo/rl_states
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from collect.actions import Action
from collect.ledger import (
    ALL_TOOLS,
    SOURCE_TOOLS,
    Asset,
    Ledger,
    NeedsDeclared,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    ObservationCommitted,
    TaskContext,
    Verdict,
    canonical_args,
    digest,
    initial_ledger,
    ready,
    reduce,
    render_digest,
)
from collect.tools import tool_schemas

SYSTEM = (
    "You are the planner of an evidence-ledger agent. Read the ledger digest and choose exactly one tool call that "
    "advances an actionable evidence need. Call finish only when finish_available is true."
)

# (task id, asset type, anchor need/source/focus, anchor value, fact need/focus, fact value, question)
TASKS = [
    (
        "demo-bridge",
        "video",
        ("name of the bridge shown", "visual", "bridge name"),
        "Harbour Bridge",
        ("opening year of the bridge", "bridge opening year"),
        "1932",
        "In which year was the bridge in the video opened?",
    ),
    (
        "demo-song",
        "audio",
        ("title of the song that is sung", "audio", "song title"),
        "Blue Moon",
        ("year the song was first recorded", "song first recorded year"),
        "1934",
        "When was the song in the clip first recorded?",
    ),
    (
        "demo-tower",
        "image",
        ("name of the tower in the photo", "visual", "tower name"),
        "Eiffel Tower",
        ("height of the tower in metres", "tower height metres"),
        "330",
        "How tall in metres is the tower in the photo?",
    ),
    (
        "demo-speech",
        "video",
        ("speaker named in the subtitles", "subtitle", "speaker name"),
        "Ada Lovelace",
        ("birth year of the speaker", "speaker birth year"),
        "1815",
        "In which year was the person who speaks born?",
    ),
    (
        "demo-river",
        "video",
        ("river shown on the map", "visual", "river name"),
        "Danube",
        ("length of the river in km", "river length km"),
        "2850",
        "How long in km is the river on the map?",
    ),
    (
        "demo-team",
        "audio",
        ("team named by the commentator", "audio", "team name"),
        "Ajax",
        ("founding year of the team", "team founding year"),
        "1900",
        "When was the team the commentator names founded?",
    ),
]


def _teacher(r0: TaskContext, s: Ledger, gold: str) -> Action:
    """Reference decision: finish when closed; else the contested or first actionable need with a serving tool."""
    if ready(s):
        return Action("finish", {"answer": gold})
    contested = [c.need_index for c in s.unresolved_conflicts()]
    i = contested[0] if contested else s.actionable_indices()[0]
    nd = s.needs[i]
    offered = [t for t in r0.tools() if t != "finish"]
    tool = next((t for t in SOURCE_TOOLS[nd.preferred_source] if t in offered), "web_search")
    query = nd.query_focus
    for d in nd.depends_on:
        if s.needs[d].value:
            query = f"{s.needs[d].value} {query}"
    if tool == "web_search":
        return Action(tool, {"query": query, "need_index": i})
    return Action(tool, {"asset_id": r0.assets[0].id, "query": query, "need_index": i})


def _observe(action: Action, need: int, value: str, verdict: str = "SUFFICIENT") -> ObservationCommitted:
    obs = NormalizedObservation(tool=action.name, ok=True, summary=f"found: {value}", items=(value,))
    up = NeedUpdate(need_index=need, status="filled", value=value, filled_by=action.name, evidence=f"says {value}")
    return ObservationCommitted(
        tool=action.name,
        arguments=canonical_args(action.arguments),
        observation=obs,
        verdict=Verdict(verdict, updates=(up,)),
        target_need=need,
    )


def _compact_view(s: Ledger) -> str:
    """A one-line-per-need ledger view (compact prompts keep CPU tests fast; rewards read the ledger column)."""
    lines = [f"{n.index} {n.status} {n.preferred_source} {n.query_focus} = {n.value}" for n in s.needs]
    lines += [f"conflict on need {c.need_index}" for c in s.unresolved_conflicts()]
    return "\n".join(lines) + f"\nactionable: {s.actionable_indices()}\nfinish_available: {ready(s)}"


def _row(r0: TaskContext, s: Ledger, gold: str, step: int, ref: Action, compact: bool = False) -> dict:
    tools = tool_schemas(r0)
    user = f"Question: {r0.question}\nAssets: {json.dumps([a.id for a in r0.assets])}\nLedger digest:\n"
    view = _compact_view(s) if compact else render_digest(r0, s)
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user + view}],
        "tools": json.dumps(tools),
        "tool_names": list(r0.tools()),
        "reference_action": json.dumps(ref.to_dict()),
        "ledger": json.dumps(s.to_dict()),
        "digest": json.dumps(digest(r0, s)),
        "question": r0.question,
        "gold_answer": gold,
        "task_id": r0.task_id,
        "step": step,
    }


def build_rows(tasks: list[tuple] | None = None, compact: bool = False) -> list[dict]:
    """rl_states rows for every decision step of each demo task (3 per task, +1 conflict state for the first).

    compact=True: a one-line-per-need ledger view instead of the full digest, and only the tools a task needs
    (its anchor tool, web_search, finish) in R0's allowed tools, so CPU smoke tests run on ~300-token prompts."""
    rows = []
    for k, (tid, kind, anchor, anchor_val, fact, fact_val, question) in enumerate(tasks or TASKS):
        asset = Asset(f"{kind}1", kind, duration=60.0 if kind != "image" else None)
        allowed = (SOURCE_TOOLS[anchor[1]][0], "web_search", "finish") if compact else ALL_TOOLS
        r0 = TaskContext(tid, question, assets=(asset,), allowed_tools=allowed)
        specs = (
            NeedSpec(anchor[0], anchor[1], "blocking", "anchor", (), anchor[2]),
            NeedSpec(fact[0], "web", "blocking", "external_fact", (0,), fact[1]),
        )
        s = reduce(initial_ledger(), NeedsDeclared(specs))
        step = 0
        for need, value in ((0, anchor_val), (1, fact_val)):
            ref = _teacher(r0, s, fact_val)
            rows.append(_row(r0, s, fact_val, step, ref, compact))
            s = reduce(s, _observe(ref, need, value))
            step += 1
        rows.append(_row(r0, s, fact_val, step, _teacher(r0, s, fact_val), compact))  # ready: the reference finishes
        if k == 0:  # a second source disagrees on the fact: unresolved conflict, finish must stay gated
            s = reduce(s, _observe(Action("web_search", {"query": "other", "need_index": 1}), 1, "1931"))
            rows.append(_row(r0, s, fact_val, step + 1, _teacher(r0, s, fact_val), compact))
    return rows


def is_eval_task(task_id: str, eval_share: float) -> bool:
    """Deterministic split by task id hash (never a task in both splits)."""
    return int(hashlib.sha1(task_id.encode()).hexdigest()[:8], 16) % 1000 < eval_share * 1000


def write_demo_states(out_dir: str | Path, eval_share: float = 0.34, compact: bool = False) -> Path:
    """Save the demo rows as a DatasetDict (train/eval) + rl_states.{train,eval}.jsonl next to it; returns out_dir."""
    from datasets import Dataset, DatasetDict

    out = Path(out_dir)
    rows = build_rows(compact=compact)
    split = {"train": [r for r in rows if not is_eval_task(r["task_id"], eval_share)]}
    split["eval"] = [r for r in rows if is_eval_task(r["task_id"], eval_share)]
    for name, part in split.items():
        if not part:
            raise ValueError(f"demo split {name!r} is empty with eval_share={eval_share}")
    DatasetDict({k: Dataset.from_list(v) for k, v in split.items()}).save_to_disk(str(out))
    for k, v in split.items():
        with open(out.parent / f"{out.name}.{k}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in v)
    return out


def texts(compact: bool = False) -> list[str]:
    """Planner-side text of the demo states (to train the tiny tokenizer on what it will read and write)."""
    out = []
    for r in build_rows(compact=compact):
        out += [m["content"] for m in r["prompt"]] + [
            r["tools"],
            Action(**json.loads(r["reference_action"])).to_text(),
        ]
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="write a small rl_states dataset built with the ledger reducer")
    ap.add_argument("--out", required=True, help="output DatasetDict directory (e.g. runs/demo/rl_states)")
    ap.add_argument("--eval_share", type=float, default=0.34)
    ap.add_argument("--compact", action="store_true", help="short prompts and per-task tool subsets (CPU tests)")
    a = ap.parse_args()
    print(write_demo_states(a.out, a.eval_share, a.compact))
