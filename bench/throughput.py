"""Harvest throughput (trajectories/s) and reward throughput ((state, completion) pairs/s) through the rule rewards
and the offline judge, on a real collect output of the embedded world."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from collect.config import load_config
from collect.harvest import harvest
from collect.run import run_collection
from rewards import REWARD_FUNCS
from rewards.judge import OfflineJudge, use_judge


def collect_fixture(out: Path, split: str = "train") -> Path:
    cfg = load_config("configs/collect/embedded.yaml", {"split": split, "progress": False})
    run_collection(cfg, out, overwrite=True)
    return out / "trajectories.jsonl"


def harvest_throughput(traj: Path, repeats: int = 3) -> dict:
    n = sum(1 for _ in open(traj))
    best = float("inf")
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            harvest(traj, d, eval_share=0.1)
            best = min(best, time.perf_counter() - t0)
    return {
        "name": "harvest_throughput",
        "figure": round(n / best, 1),
        "unit": "trajectories/s (best of 3, incl. datasets save_to_disk + JSONL)",
        "target": "report",
        "met": None,
        "inputs": {"trajectories": n},
    }


def reward_throughput(rl_states_jsonl: Path, n_pairs: int = 2000) -> dict:
    rows = [json.loads(x) for x in open(rl_states_jsonl)]
    # candidates: each state's reference action, plus a finish and an off-target call (what GRPO samples look like)
    cols = {k: [] for k in ("tools", "ledger", "reference_action", "gold_answer", "digest", "question")}
    comps = []
    i = 0
    while len(comps) < n_pairs:
        r = rows[i % len(rows)]
        ref = json.loads(r["reference_action"])
        cand = [
            f"<tool_call>\n{json.dumps(ref)}\n</tool_call>",
            '<tool_call>\n{"name": "finish", "arguments": {"answer": "x"}}\n</tool_call>',
            f'<tool_call>\n{{"name": "web_search", "arguments": {{"query": "weather {i}"}}}}\n</tool_call>',
        ][i % 3]
        comps.append([{"role": "assistant", "content": cand}])
        for k in cols:
            cols[k].append(r.get(k))
        i += 1
    use_judge(OfflineJudge())
    t0 = time.perf_counter()
    out = {}
    for name, fn in REWARD_FUNCS.items():
        res = fn(comps, **cols)
        out[name] = asyncio.run(res) if asyncio.iscoroutine(res) else res
    wall = time.perf_counter() - t0
    return {
        "name": "reward_throughput",
        "figure": round(len(comps) / wall, 1),
        "unit": "(state, completion) pairs/s through valid+gate+target+align (offline judge)",
        "target": "report",
        "met": None,
        "inputs": {"pairs": len(comps), "states": len(rows)},
        "extra": {name: round(sum(v for v in vals if v is not None) / len(vals), 3) for name, vals in out.items()},
    }
