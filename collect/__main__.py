"""`python -m collect --config configs/collect/embedded.yaml [--out runs/collect] [--split test] [--limit N]
[--tasks FILE] [--allow-missing-media] [--workers N|auto] [--shard K/N]`: run the teacher over tasks, judge, write
OUT/trajectories.jsonl +
OUT/summary.json, then harvest OUT/sft and OUT/rl_states from the judged-correct trajectories."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from collect import jsonio
from collect.cli import run_cli
from collect.config import load_config
from collect.harvest import harvest
from collect.run import RunDirError, run_collection, setup_logging


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n} (omit --limit to run every task)")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collect", description=__doc__)
    ap.add_argument("--config", default="configs/collect/embedded.yaml")
    ap.add_argument("--out", default="runs/collect", help="output folder (resumable)")
    ap.add_argument("--split", default=None, help="override the config's split (train|dev|test|all)")
    ap.add_argument("--limit", type=_positive_int, default=None, help="first N tasks of the split (N >= 1)")
    ap.add_argument("--tasks", default=None, help="a task file in the schema, instead of the configured source")
    ap.add_argument(
        "--allow-missing-media",
        action="store_true",
        help="run tasks whose media files are missing (the pre-flight refuses them otherwise); they are marked in "
        "task_meta.missing_media and counted in the summary",
    )
    ap.add_argument("--no-harvest", action="store_true", help="skip building the SFT / RL datasets")
    ap.add_argument("--overwrite", action="store_true", help="discard an existing OUT instead of resuming")
    ap.add_argument("--allow-mixed-config", action="store_true", help="resume into an OUT made by another config")
    ap.add_argument(
        "--rerun-changed", action="store_true", help="run again the finished tasks whose content changed since"
    )
    ap.add_argument(
        "--allow-subset",
        action="store_true",
        help="select fewer tasks than OUT has finished (summary.json then covers the selection only)",
    )
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--workers", default=None, help="worker processes on this machine: N or 'auto' (default: config)")
    ap.add_argument("--shard", default=None, help="K/N: run only shard K of N (merge with python -m collect.merge)")
    args = ap.parse_args(argv)
    setup_logging()

    overrides = {"split": args.split, "limit": args.limit, "workers": args.workers, "shard": args.shard}
    if args.tasks:
        overrides["tasks"] = {"kind": "file", "path": args.tasks}
    if args.no_progress:
        overrides["progress"] = False
    if args.allow_missing_media:
        overrides["allow_missing_media"] = True
    try:
        cfg = load_config(args.config, overrides)
        harvesting = cfg.harvest.get("enabled", True) and not args.no_harvest
        summary = run_collection(
            cfg,
            args.out,
            allow_mixed_config=args.allow_mixed_config,
            overwrite=args.overwrite,
            rerun_changed=args.rerun_changed,
            allow_subset=args.allow_subset,
            for_training=harvesting,  # training rows never come from evaluation tasks: refused before any task runs
        )
    except (ValueError, FileNotFoundError, RunDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    keys = (
        "n_tasks",
        "accuracy",
        "n_judged",
        "n_unjudged",
        "outcomes",
        "avg_tool_calls",
        "valid_action_rate",
        "wall_s",
    )
    print(jsonio.dumps({k: summary.get(k) for k in keys}, nonfinite="string", indent=1))
    if summary.get("n_unjudged"):
        print(
            f"warning: {summary['n_unjudged']} of {summary['n_tasks']} task(s) are unjudged and not in the accuracy "
            f"(the judge gave no usable verdict; first: {summary.get('first_unjudged_detail') or 'no detail'}); "
            "summary.json lists them in unjudged_tasks",
            file=sys.stderr,
        )
    if summary.get("errored_tasks"):
        print(
            f"warning: {len(summary['errored_tasks'])} task(s) did not finish (see summary.json errored_tasks); "
            "rerun the same command to retry them",
            file=sys.stderr,
        )
    if harvesting:
        stats = harvest(Path(args.out) / "trajectories.jsonl", args.out, eval_share=cfg.harvest.get("eval_share", 0.1))
        print(jsonio.dumps({"harvest": stats}, nonfinite="string", indent=1, default=str))
    return 3 if summary.get("errored_tasks") else 0


if __name__ == "__main__":
    run_cli(main)
