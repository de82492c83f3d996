"""Combine shard OUTs (`python -m collect --shard K/N --out ...`) into one OUT, then harvest it.

    python -m collect.merge OUT1 OUT2 ... --out MERGED [--no-harvest] [--overwrite]

Refuses (exit 2, nothing written): an input without run_config.json, inputs of different configurations (config_hash
differs; the shard spec is not part of it), two inputs of the same shard, a task present in two inputs (or twice in
one), a MERGED that already holds trajectories (unless --overwrite). Writes MERGED/trajectories.jsonl with every
input line copied byte for byte in task-id order, MERGED/run_config.json (the shared config, shard unset, the inputs
listed), MERGED/summary.json recomputed from the merged file (errored tasks of the inputs carried over), then the
harvest (MERGED/sft, MERGED/rl_states) unless --no-harvest. Exit 3 when an input had errored tasks or shards are
missing (rerun those shards, then merge again). Placement on a cluster: docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from collect import jsonio
from collect.cli import run_cli
from collect.config import parse_shard
from collect.harvest import harvest
from collect.summary import summarize
from collect.trajectory import iter_trajectories


class MergeError(ValueError):
    pass


def _meta(out: Path) -> dict:
    p = out / "run_config.json"
    if not p.exists():
        raise MergeError(f"{out}: no run_config.json (not a collect OUT)")
    try:
        meta = jsonio.loads(p.read_bytes())
    except jsonio.BadJSON as e:
        raise MergeError(f"{p}: unreadable ({e})") from None
    if not isinstance(meta, dict) or not meta.get("config_hash"):
        raise MergeError(f"{p}: no config_hash")
    return meta


def _lines(out: Path) -> list[tuple[str, bytes, dict]]:
    """(task id, raw line, record) of every complete record of OUT (the common torn-line policy)."""
    path = out / "trajectories.jsonl"
    if not path.exists():
        return []
    raw = path.read_bytes().split(b"\n")  # line i of iter_trajectories is raw[i - 1]
    return [(rec["task_id"], raw[i - 1] + b"\n", rec) for i, rec in iter_trajectories(path)]


def merge(inputs: list[str | os.PathLike], out: str | os.PathLike, *, overwrite: bool = False) -> dict:
    """Merge shard OUTs into `out`; returns the merged summary (with a `merge` entry). Raises MergeError."""
    ins = [Path(p) for p in inputs]
    if not ins:
        raise MergeError("no input OUT given")
    out = Path(out)
    if any(p.resolve() == out.resolve() for p in ins):
        raise MergeError(f"{out} is also an input")
    metas = [_meta(p) for p in ins]
    hashes = {m["config_hash"] for m in metas}
    if len(hashes) > 1:
        listing = ", ".join(f"{p}: {m['config_hash']}" for p, m in zip(ins, metas, strict=True))
        raise MergeError(f"inputs of different configurations refuse to merge ({listing})")
    shards = [(m.get("config") or {}).get("shard") for m in metas]
    ns = {parse_shard(s)[1] for s in shards if s is not None}
    if len(ns) > 1 or (ns and None in shards):
        raise MergeError(f"inputs split the tasks in different ways (shards {shards}); merge the shards of one K/N")
    seen_shard: dict[str, Path] = {}
    for p, s in zip(ins, shards, strict=True):
        if s is not None and s in seen_shard:
            raise MergeError(f"shard {s} is given twice ({seen_shard[s]} and {p})")
        if s is not None:
            seen_shard[s] = p
    owner: dict[str, Path] = {}
    rows: list[tuple[str, bytes, dict]] = []
    for p in ins:
        for task_id, line, rec in _lines(p):
            if task_id in owner:
                raise MergeError(f"task {task_id!r} is in {owner[task_id]} and in {p}: refusing to merge duplicates")
            owner[task_id] = p
            rows.append((task_id, line, rec))
    traj = out / "trajectories.jsonl"
    if traj.exists() and traj.stat().st_size > 0 and not overwrite:
        raise MergeError(f"{out} already holds trajectories; use a new --out or --overwrite")

    rows.sort(key=lambda r: r[0])
    out.mkdir(parents=True, exist_ok=True)
    tmp = traj.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        for _, line, _ in rows:
            f.write(line)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, traj)

    config = dict(metas[0].get("config") or {})
    config["shard"] = None
    missing = []
    if ns:
        n = ns.pop()
        missing = [f"{k}/{n}" for k in range(n) if f"{k}/{n}" not in seen_shard]
    merged_meta = {"config_hash": metas[0]["config_hash"], "config": config, "merged_from": [str(p) for p in ins]}
    jsonio.write_json(out / "run_config.json", merged_meta, nonfinite="refuse", default=str)
    old = [_summary(p) for p in ins]
    endpoints = config.get("endpoints") or {}
    priced = any((e or {}).get("price_in_per_mtok") or (e or {}).get("price_out_per_mtok") for e in endpoints.values())
    summary = summarize([r for _, _, r in rows], prices_configured=priced)
    summary.update(
        {
            "config_hash": metas[0]["config_hash"],
            "split": config.get("split"),
            "arm": (config.get("runtime") or {}).get("arm"),
            "wall_s": round(max((s.get("wall_s") or 0.0) for s in old), 2),  # the shards ran side by side
        }
    )
    errored: dict[str, str] = {}
    for s in old:
        errored.update({k: v for k, v in (s.get("errored_tasks") or {}).items() if k not in owner})
    summary["errored_tasks"] = errored
    summary["merge"] = {
        "inputs": [str(p) for p in ins],
        "shards": shards,
        "missing_shards": missing,
        "tasks_per_input": [sum(1 for o in owner.values() if o == p) for p in ins],
    }
    jsonio.write_json(out / "summary.json", summary)
    return summary


def _summary(out: Path) -> dict:
    try:
        return jsonio.loads((out / "summary.json").read_bytes())
    except (OSError, jsonio.BadJSON):
        return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collect.merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="shard OUT folders")
    ap.add_argument("--out", required=True, help="merged OUT folder")
    ap.add_argument("--no-harvest", action="store_true", help="skip building the SFT / RL datasets")
    ap.add_argument("--overwrite", action="store_true", help="replace the trajectories of an existing merged OUT")
    args = ap.parse_args(argv)
    try:
        summary = merge(args.inputs, args.out, overwrite=args.overwrite)
    except MergeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    keys = ("n_tasks", "accuracy", "outcomes", "merge")
    print(jsonio.dumps({k: summary.get(k) for k in keys}, nonfinite="string", indent=1))
    if not args.no_harvest:
        cfg = json.loads((Path(args.out) / "run_config.json").read_text())["config"]
        h = cfg.get("harvest") or {}
        if h.get("enabled", True):
            stats = harvest(Path(args.out) / "trajectories.jsonl", args.out, eval_share=h.get("eval_share", 0.1))
            print(jsonio.dumps({"harvest": stats}, nonfinite="string", indent=1, default=str))
    problems = []
    if summary["errored_tasks"]:
        problems.append(f"{len(summary['errored_tasks'])} task(s) did not finish in their shard")
    if summary["merge"]["missing_shards"]:
        problems.append(f"missing shard(s) {summary['merge']['missing_shards']}")
    if problems:
        print(f"warning: {'; '.join(problems)}; rerun those shards, then merge again", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    run_cli(main, "nothing is written until the merge finishes: rerun it")
