"""Teacher runs of the real collect engine on the first N train tasks of the 1,800-task embedded world
(configs/collect/embedded_1800.yaml) with the references offered set per run: what the reference tests compare."""

from __future__ import annotations

import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collect_refs(out: Path, n_tasks: int, references: tuple[str, ...]) -> tuple[list[dict], Path]:
    """(trajectories sorted by task id, out) of the offline teacher over the first n_tasks train tasks of the shipped
    recipe with `references` offered (RuntimeConfig.references)."""
    from collect.config import load_config
    from collect.run import run_collection
    from collect.trajectory import read_trajectories

    cfg = load_config(ROOT / "configs/collect/embedded_1800.yaml", {"limit": n_tasks, "progress": False})
    cfg.runtime = dataclasses.replace(cfg.runtime, references=tuple(references))
    summary = run_collection(cfg, out)
    assert not summary["errored_tasks"]
    return sorted(read_trajectories(out / "trajectories.jsonl"), key=lambda r: r["task_id"]), out


def same_calls_with_and_without(on: list[dict], off: list[dict], kind: str, marker: str) -> int:
    """Assert two teacher runs of the same tasks (a reference kind offered / not) end the same way, that only `on`'s
    prompts offer the kind (collect.actions.offered_refs) and that every tool got the same arguments; return how many
    of `on`'s steps wrote `marker` (e.g. "{window:") in their action."""
    import json

    from collect.actions import offered_refs

    assert [(r["task_id"], r["outcome"], r["answer"]) for r in on] == [
        (r["task_id"], r["outcome"], r["answer"]) for r in off
    ]
    written = 0
    for a, b in zip(on, off, strict=True):
        for sa, sb in zip(a["steps"], b["steps"], strict=True):
            assert kind in offered_refs(sa["planner_input"]["messages"])
            assert kind not in offered_refs(sb["planner_input"]["messages"])
            got = [s.get("resolved_arguments", s["action"]["arguments"]) for s in (sa, sb)]  # what the tool got
            assert got[0] == got[1]
            written += marker in json.dumps(sa["action"])
    return written


def harvested_decisions(out: Path) -> list[dict]:
    """Harvest a teacher run as `make collect` does and return its decision rows; no step may be skipped as invalid
    (a reference is checked as the tool got it and kept as written)."""
    import json

    from collect.harvest import harvest

    stats = harvest(out / "trajectories.jsonl", out / "data", eval_share=0.0)
    assert stats.get("steps_invalid_action", 0) == 0
    rows = [json.loads(x) for x in (out / "data" / "sft.train.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "decision"]


def relabelled_with_and_without(on: list[dict], off: list[dict], marker: str) -> int:
    """Relabel both runs' steps with the teacher (round 1); assert every label fits its step and none of `off`'s
    writes `marker`; return how many of `on`'s labels write it."""
    import json
    from collections import Counter

    from pipeline.relabel import relabel_trajectory

    c_on, c_off = Counter(), Counter()
    rows_on = [row for t in on for row in relabel_trajectory(t, 1, c_on)[0]]
    rows_off = [row for t in off for row in relabel_trajectory(t, 1, c_off)[0]]
    assert c_on["teacher_invalid"] == 0 and c_on["states"] == c_off["states"]
    assert not any(marker in json.dumps(r["completion"]) for r in rows_off)
    return sum(marker in json.dumps(r["completion"]) for r in rows_on)
