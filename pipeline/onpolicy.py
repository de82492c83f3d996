"""Rounds of on-policy relabelling + state-SFT (DAgger-style; docs/training.md "On-policy relabelling").

    python -m pipeline.onpolicy --config configs/onpolicy/tiny.yaml --model SFT_OUT/merged [--rounds N] [--out DIR]

Round k (1..N): the current planner runs over the recipe's split (never test) and the teacher labels every state it
reached (pipeline.relabel.run_relabel -> DIR/round{k}/); the SFT dataset of round k is the teacher rows + the on-policy
rows of rounds 1..k, identical prompts once (pipeline.relabel.aggregate -> DIR/round{k}/data); sft.train trains on it
(`init: previous` fine-tunes round k-1's model, `init: scratch` trains the recipe from its tiny base) ->
DIR/round{k}/sft/merged, the planner of round k+1; DIR/final_sft links to the last round's. With `rl: true`, GRPO
(rl.train) then runs on the last round's aggregated rl_states (teacher + student-reached states) -> DIR/rl.
DIR/onpolicy_summary.json: every round's figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from collect import jsonio
from collect.cli import run_cli
from collect.config import load_recipe
from collect.processes import parse_processes
from collect.run import RunDirError, setup_logging
from pipeline.planners import PLANNER_ENDPOINT
from pipeline.relabel import aggregate, check_split, run_relabel


@dataclass
class OnPolicyConfig:
    collect: str = field(default="configs/collect/embedded.yaml", metadata={"help": "runtime recipe (critic etc.)"})
    split: str = field(default="train", metadata={"help": "split the student runs on (train | dev; never test)"})
    limit: int | None = field(default=None, metadata={"help": "first N tasks of the split"})
    teacher_data: str = field(default="runs/collect", metadata={"help": "teacher harvest dir (sft.*.jsonl ...)"})
    rounds: int = field(default=2, metadata={"help": "relabel + SFT rounds"})
    planner_endpoint: dict = field(
        default_factory=lambda: dict(PLANNER_ENDPOINT), metadata={"help": "the student's endpoint settings"}
    )
    concurrency: int | None = field(default=4, metadata={"help": "tasks in flight while the student runs"})
    relabel_processes: int | str = field(
        default=1,
        metadata={"help": "checkpoint student: its run in this many task shards at once, spawned processes (N|auto)"},
    )
    sft_config: str = field(default="configs/sft/tiny.yaml", metadata={"help": "sft.train recipe"})
    sft_args: dict = field(default_factory=dict, metadata={"help": "sft.train overrides, e.g. {max_steps: 600}"})
    init: str = field(default="previous", metadata={"help": "previous: fine-tune the last model | scratch"})
    rl: bool = field(default=False, metadata={"help": "GRPO on the last round's aggregated rl_states"})
    rl_config: str = field(default="configs/rl/tiny.yaml")
    rl_args: dict = field(default_factory=dict, metadata={"help": "rl.train overrides (origins: onpolicy, ...)"})
    eval_share: float = 0.1
    seed: int = field(default=0, metadata={"help": "train/eval split of tasks the teacher never kept (as harvest)"})
    train_seed: int | None = field(
        default=None, metadata={"help": "seed of every SFT round and of GRPO (None: the recipes')"}
    )

    def __post_init__(self):
        check_split(self.split)
        self.relabel_processes = parse_processes(self.relabel_processes, "relabel_processes")
        if self.init not in ("previous", "scratch"):
            raise ValueError(f"init must be previous or scratch, got {self.init!r}")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")


def load_onpolicy_config(path: str, overrides: dict | None = None) -> OnPolicyConfig:
    return load_recipe(OnPolicyConfig, path, overrides, "on-policy recipe")


def _flags(d: dict) -> list[str]:
    out = []
    for k, v in d.items():
        if isinstance(v, list | tuple):  # e.g. reward_weights as TRL's list: one argument per value
            out += [f"--{k}", *map(str, v)]
        else:
            out += [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return out


def _seed(cfg: OnPolicyConfig) -> dict:
    return {} if cfg.train_seed is None else {"seed": cfg.train_seed}


def _stage(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", *args], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return round(time.perf_counter() - t0, 1)


def run_onpolicy(cfg: OnPolicyConfig, model: str, out: str | Path) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not Path(model).is_dir():
        raise FileNotFoundError(f"start planner not found: {model}")
    summary: dict = {"config": dataclasses.asdict(cfg), "start_model": model, "rounds": []}
    # Resume: rounds a killed run finished (same recipe and start model, merged model on disk) are kept, not redone.
    prev = out / "onpolicy_summary.json"
    done_before = []
    if prev.exists():
        old = json.loads(prev.read_text())
        if old.get("config") == json.loads(json.dumps(summary["config"])) and old.get("start_model") == model:
            done_before = [r for r in old.get("rounds", []) if Path(r.get("model", "")).is_dir()]
    rounds_done: list[Path] = []
    for k in range(1, cfg.rounds + 1):
        rdir = out / f"round{k}"
        if len(done_before) >= k and done_before[k - 1].get("model") == str(rdir / "sft" / "merged"):
            print(f"round {k}: done in an earlier run, kept ({rdir})", file=sys.stderr)
            summary["rounds"].append(done_before[k - 1])
            rounds_done.append(rdir)
            model = done_before[k - 1]["model"]
            continue
        t0 = time.perf_counter()
        stats = run_relabel(
            {"checkpoint": model},
            rdir,
            k,
            config=cfg.collect,
            split=cfg.split,
            limit=cfg.limit,
            planner_defaults=cfg.planner_endpoint,
            concurrency=cfg.concurrency,
            processes=cfg.relabel_processes,
        )
        stats["relabel_s"] = round(time.perf_counter() - t0, 1)
        rounds_done.append(rdir)
        stats["aggregate"] = aggregate(cfg.teacher_data, rounds_done, rdir / "data", cfg.eval_share, cfg.seed)
        sft_out = rdir / "sft"
        args = ["sft.train", "--config", cfg.sft_config, "--dataset_dir", str(rdir / "data" / "sft")]
        args += ["--output_dir", str(sft_out), *_flags({**_seed(cfg), **cfg.sft_args})]
        if cfg.init == "previous":
            args += ["--model_name_or_path", model]
        stats["sft_s"] = _stage(args)
        model = str(sft_out / "merged")
        stats["model"] = model
        summary["rounds"].append(stats)
        _write(out / "onpolicy_summary.json", summary)
    summary["final_sft_model"] = model
    _link_final(out / "final_sft", Path(model))
    if cfg.rl:
        rl_out = out / "rl"
        args = ["rl.train", "--config", cfg.rl_config, "--dataset_dir", str(rounds_done[-1] / "data" / "rl_states")]
        args += ["--model_name_or_path", model, "--output_dir", str(rl_out), *_flags({**_seed(cfg), **cfg.rl_args})]
        summary["rl_s"] = _stage(args)
        summary["final_rl_model"] = str(rl_out)
    _write(out / "onpolicy_summary.json", summary)
    return summary


def _link_final(link: Path, target: Path) -> None:
    """DIR/final_sft -> roundN/sft/merged (relative), so a recipe's eval config names the last round's planner
    whatever ROUNDS is (configs/eval/measure.yaml). Replaced atomically on every run."""
    tmp = link.with_name(link.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(os.path.relpath(target, link.parent), target_is_directory=True)
    os.replace(tmp, link)


def _write(path: Path, obj: dict) -> None:
    jsonio.write_json(path, obj, default=str)  # strict JSON, atomic


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.onpolicy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/onpolicy/tiny.yaml")
    ap.add_argument("--model", required=True, help="the start planner (a state-SFT checkpoint)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", default="runs/onpolicy")
    ap.add_argument("--teacher-data", default=None, help="teacher harvest dir (overrides the recipe's teacher_data)")
    ap.add_argument("--seed", type=int, default=None, help="training seed of every round's SFT and of GRPO")
    a = ap.parse_args(argv)
    setup_logging()
    try:
        overrides = {"rounds": a.rounds, "limit": a.limit, "teacher_data": a.teacher_data, "train_seed": a.seed}
        cfg = load_onpolicy_config(a.config, overrides)
        summary = run_onpolicy(cfg, a.model, a.out)
    except (ValueError, FileNotFoundError, RunDirError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(jsonio.dumps({k: v for k, v in summary.items() if k != "config"}, nonfinite="string", indent=1, default=str))
    return 0


if __name__ == "__main__":
    run_cli(main, "finished rounds are kept: rerun the same command to resume")
