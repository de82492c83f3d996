"""Synthetic planner trajectories in the shared trajectory JSONL format, built with the real ledger core.

Why: tests and the CPU smoke run of harvest -> SFT -> serve need trajectories before (and independently of) the collect
stage and the embedded world. Every ledger here is produced by `collect.ledger.reduce`, every prompt carries the real
`collect.ledger.render_digest`, and every recorded action is `collect.actions.Action` text, so the data has the shape
and vocabulary of real planner states. It is NOT the embedded world: nothing here is a benchmark.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

from collect.actions import Action
from collect.ledger import (
    SOURCE_TOOLS,
    Asset,
    NeedsDeclared,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    ObservationCommitted,
    TaskContext,
    Verdict,
    canonical_args,
    event_to_dict,
    initial_ledger,
    ready,
    reduce,
    state_hash,
)
from collect.roles.render import render_planner_messages
from collect.tools import tool_schemas

_SUBJECTS = [
    "the red kettle",
    "the harbour bridge",
    "the violin solo",
    "the museum map",
    "the bus timetable",
    "the chess clock",
    "the weather chart",
    "the recipe card",
    "the train station",
    "the tennis score",
]
_FACTS = [
    "founding year",
    "height in metres",
    "population",
    "opening date",
    "distance in km",
    "price in euros",
    "number of floors",
    "top speed",
    "capital city",
    "record holder",
]
_SOURCES = ["subtitle", "audio", "visual", "web", "computation"]


def _choose(r0: TaskContext, ledger, answer: str) -> Action:
    """Teacher policy: finish when ready, else the first actionable need with a tool serving its source."""
    if ready(ledger):
        return Action("finish", {"answer": answer})
    i = ledger.actionable_indices()[0]
    nd = ledger.needs[i]
    offered = [t for t in r0.tools() if t != "finish"]
    tool = next((t for t in SOURCE_TOOLS[nd.preferred_source] if t in offered), "web_search")
    if tool == "code_executor":
        return Action(tool, {"code": f"print({nd.query_focus!r})", "need_index": i})
    args = {"query": nd.query_focus, "need_index": i}
    if tool not in ("web_search",):
        args = {"asset_id": r0.assets[0].id, **args}
    return Action(tool, args)


def make_trajectory(rng: random.Random, k: int, correct: bool | None = True) -> dict:
    """One task in the trajectory JSONL format: needs declared, one step per need, then finish."""
    subject, fact = rng.choice(_SUBJECTS), rng.choice(_FACTS)
    kind = rng.choice(["video", "audio", "image"])
    r0 = TaskContext(
        task_id=f"syn-{k:05d}",
        question=f"What is the {fact} of {subject} shown in the {kind}?",
        assets=(Asset(id=f"{kind}_{k}", type=kind, duration=30.0 if kind != "image" else None),),
    )
    specs = tuple(
        NeedSpec(
            need=f"{'identify' if j == 0 else 'find'} {subject if j == 0 else fact}",
            preferred_source=rng.choice(_SOURCES) if j else {"video": "visual", "audio": "audio"}.get(kind, "visual"),
            need_role="anchor" if j == 0 else "external_fact",
            depends_on=(j - 1,) if j else (),
            query_focus=f"{subject} {fact}" if j else subject,
        )
        for j in range(rng.randint(1, 3))
    )
    answer = str(rng.randint(2, 2000))
    ledger = reduce(initial_ledger(), NeedsDeclared(needs=specs))
    need_parse_text = json.dumps([s.__dict__ | {"depends_on": list(s.depends_on)} for s in specs], ensure_ascii=False)
    steps = []
    observation = None
    for t in range(len(specs) + 1):
        messages = render_planner_messages(r0, ledger, observation, "ledger")
        tools = tool_schemas(r0)
        action = _choose(r0, ledger, answer)
        before = ledger.to_dict()
        events = []
        if action.name != "finish":
            i = action.arguments["need_index"]
            value = answer if i == len(specs) - 1 else subject
            ev = ObservationCommitted(
                tool=action.name,
                arguments=canonical_args(action.arguments),
                observation=NormalizedObservation(tool=action.name, ok=True, summary=f"found {value}"),
                verdict=Verdict("SUFFICIENT", updates=(NeedUpdate(i, "filled", value=value, evidence=value),)),
                target_need=i,
            )
            ledger = reduce(ledger, ev)
            events.append(event_to_dict(ev))
            observation = f"{action.name}: found {value}"
        steps.append(
            {
                "t": t,
                "planner_input": {"messages": messages, "tools": tools},
                "planner_output": {"text": action.to_text(), "tool_calls": []},
                "action": action.to_dict(),
                "raw_observation": "",
                "observation": {},
                "verdict": {},
                "events": events,
                "ledger_before": before,
                "ledger_hash": state_hash(ledger),
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "latency_s": 0.0,
            }
        )
    return {
        "task_id": r0.task_id,
        "config_hash": "synthetic",
        "arm": "ledger",
        "models": {"planner": "teacher"},
        "outcome": "accepted",
        "answer": answer,
        "correct": correct,
        "question": r0.question,
        "gold_answer": answer,
        "need_parse": {
            "input": {"messages": [{"role": "user", "content": f"Declare the evidence needs for: {r0.question}"}]},
            "needs": json.loads(need_parse_text),
            "output_text": need_parse_text,
        },
        "steps": steps,
        "final_ledger": ledger.to_dict(),
        "usage": {},
    }


def trajectories(n: int, seed: int = 0, correct_share: float = 1.0) -> Iterator[dict]:
    """n synthetic trajectories, deterministic by seed; a (1 - correct_share) part is judged incorrect."""
    rng = random.Random(seed)
    for k in range(n):
        yield make_trajectory(rng, k, correct=rng.random() < correct_share)


def write_trajectories(path, n: int, seed: int = 0, correct_share: float = 1.0) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for tr in trajectories(n, seed, correct_share):
            f.write(json.dumps(tr, ensure_ascii=False) + "\n")


def texts(n: int = 400, seed: int = 0) -> Iterator[str]:
    """Tokenizer-training text of the kind the planner reads and writes: prompts, tool schemas and actions."""
    for tr in trajectories(n, seed):
        yield tr["need_parse"]["output_text"]
        for st in tr["steps"]:
            for m in st["planner_input"]["messages"]:
                yield m["content"]
            yield json.dumps(st["planner_input"]["tools"], ensure_ascii=False)
            yield st["planner_output"]["text"]


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="write synthetic planner trajectories (JSONL)")
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--correct-share", type=float, default=0.9)
    a = ap.parse_args()
    write_trajectories(a.out, a.n, a.seed, a.correct_share)
    print(f"wrote {a.n} trajectories to {a.out}")
