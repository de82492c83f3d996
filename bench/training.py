"""Training speed on CPU (informational; the same entry scripts run unchanged on a GPU node): tokens/s for the tiny
SFT recipe and seconds per GRPO step for the tiny RL recipe, each run as the real entry script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0


def run(work: Path, data: Path, sft_steps: int = 30, rl_steps: int = 4) -> list[dict]:
    sft_out = work / "sft"
    wall = _run(
        [
            sys.executable,
            "-m",
            "sft.train",
            "--config",
            "configs/sft/tiny.yaml",
            "--dataset_dir",
            str(data / "sft"),
            "--output_dir",
            str(sft_out),
            "--max_steps",
            str(sft_steps),
        ]
    )
    s = json.loads((sft_out / "train_summary.json").read_text())
    tok_s = (s["num_tokens"] / s["train_time_s"]) if s.get("num_tokens") and s.get("train_time_s") else None
    rl_out = work / "rl"
    rl_wall = _run(
        [
            sys.executable,
            "-m",
            "rl.train",
            "--config",
            "configs/rl/tiny.yaml",
            "--dataset_dir",
            str(data / "rl_states"),
            "--model_name_or_path",
            str(sft_out / "merged"),
            "--output_dir",
            str(rl_out),
            "--max_steps",
            str(rl_steps),
        ]
    )
    r = json.loads((rl_out / "rl_summary.json").read_text())
    return [
        {
            "name": "sft_tiny_tokens_per_s",
            "figure": round(tok_s, 1) if tok_s else None,
            "unit": "training tokens/s (tiny recipe, CPU)",
            "target": "report",
            "met": None,
            "inputs": {"steps": sft_steps, "recipe": "configs/sft/tiny.yaml"},
            "extra": {"process_wall_s": round(wall, 1), "summary": s},
        },
        {
            "name": "grpo_tiny_s_per_step",
            "figure": round(r["s_per_step"], 2),  # trainer wall time / steps (model loading excluded)
            "unit": "s/GRPO step (tiny recipe, CPU)",
            "target": "report",
            "met": None,
            "inputs": {"steps": rl_steps, "recipe": "configs/rl/tiny.yaml"},
            "extra": {"process_wall_s": round(rl_wall, 1), "summary": r},
        },
    ]
