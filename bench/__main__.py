"""`make bench`: run every benchmark, print a table, write bench/results.json.

Figures, not timed tests; ratios are measured within one run. Each entry: name, figure, unit, target, met, inputs,
machine (and extra detail)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from bench import concurrency, context, overhead, throughput, training, values
from collect import jsonio
from collect.cli import run_cli
from collect.harvest import harvest
from sft.tiny import build_tiny_model


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--out", default="bench/results.json")
    ap.add_argument("--only", default=None, help="comma list: overhead,values,context,concurrency,throughput,training")
    ap.add_argument("--tasks", type=int, default=None, help="tasks the concurrency benchmark cycles (default: all)")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    want = lambda k: only is None or k in only  # noqa: E731
    results: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="od-bench-"))
    t_all = time.perf_counter()

    if want("overhead"):
        results.append(overhead.run())
        results.append(overhead.reducer_scaling())
    if want("values"):
        results.append(values.run())
    if want("context") or want("training"):
        tiny = build_tiny_model(work / "tiny", seed=0)
    if want("context"):
        results.append(context.run(AutoTokenizer.from_pretrained(tiny)))
    if want("concurrency"):
        results.extend(concurrency.run(n_tasks=args.tasks))
    if want("throughput") or want("training"):
        traj = throughput.collect_fixture(work / "collect")
        harvest(traj, work / "collect", eval_share=0.1)
    if want("throughput"):
        results.append(throughput.harvest_throughput(traj))
        results.append(throughput.reward_throughput(work / "collect" / "rl_states.train.jsonl"))
    if want("training"):
        results.extend(training.run(work, work / "collect"))

    mach = machine()
    for r in results:
        r["machine"] = mach
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jsonio.write_json(out, results, default=str)
    print(f"\n{'benchmark':34s} {'figure':>12s}  {'unit':58s} {'target':>12s}  met")
    for r in results:
        met = {True: "yes", False: "NO", None: "-"}[r.get("met")]
        print(f"{r['name']:34s} {r['figure']!s:>12} {r['unit'][:58]:58s} {r['target']:>12s}  {met}")
    print(f"\n{mach['date']} · {mach['platform']} · {mach['cpus']} CPUs · torch {mach['torch']}")
    print(f"total {time.perf_counter() - t_all:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    run_cli(main, "no figures were written")
