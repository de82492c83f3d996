"""Training speed on CPU (informational; the same entry scripts run unchanged on a GPU node): tokens/s and peak memory
of the tiny SFT recipe and, beside it on the same rows, of LoRA SFT of the real pretrained checkpoint (SmolLM2-135M,
`make real-model`; the row says why when it is absent), and seconds per GRPO step for the tiny RL recipe, each run as
the real entry script in a subprocess. Peak memory is the subprocess's own maximum resident set (os.wait4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sft import real_model

ROOT = Path(__file__).resolve().parents[1]
REAL_RECIPE = "configs/sft/smollm2_lora.yaml"


def _run(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak resident bytes of the process) of one entry-script run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read().decode(errors='replace')[-3000:]}")
    return time.perf_counter() - t0, usage.ru_maxrss * 1024  # Linux: KiB


def _sft(out: Path, data: Path, recipe: str, steps: int, *extra: str) -> tuple[dict, float, int]:
    wall, peak = _run(
        [sys.executable, "-m", "sft.train", "--config", recipe, "--dataset_dir", str(data / "sft"),
         "--output_dir", str(out), "--max_steps", str(steps), *extra]
    )  # fmt: skip
    return json.loads((out / "train_summary.json").read_text()), wall, peak


def _tokens_per_s(s: dict) -> float | None:
    return round(s["num_tokens"] / s["train_time_s"], 1) if s.get("num_tokens") and s.get("train_time_s") else None


def real_sft(work: Path, data: Path, steps: int = 4) -> dict:
    """LoRA SFT of the real checkpoint (configs/sft/smollm2_lora.yaml), one row per step (so `steps` rows)."""
    row = {
        "name": "sft_real_lora_tokens_per_s",
        "unit": "training tokens/s (SmolLM2-135M LoRA q/k/v/o, CPU)",
        "target": "report",
        "met": None,
        "inputs": {"steps": steps, "recipe": REAL_RECIPE, "model": str(real_model.DEFAULT_OUT)},
    }
    if not real_model.up_to_date(real_model.DEFAULT_OUT):
        return {**row, "figure": None, "extra": {"skipped": f"{real_model.DEFAULT_OUT} absent: run make real-model"}}
    s, wall, peak = _sft(work / "sft_real", data, REAL_RECIPE, steps, "--gradient_accumulation_steps", "1",
                         "--warmup_steps", "0", "--logging_steps", "1", "--merge", "false")  # fmt: skip
    extra = {"process_wall_s": round(wall, 1), "peak_rss_mib": round(peak / 2**20), "summary": s}
    return {**row, "figure": _tokens_per_s(s), "extra": extra}


def run(work: Path, data: Path, sft_steps: int = 30, rl_steps: int = 4, real_steps: int = 4) -> list[dict]:
    sft_out = work / "sft"
    s, wall, peak = _sft(sft_out, data, "configs/sft/tiny.yaml", sft_steps)
    rl_out = work / "rl"
    rl_wall, rl_peak = _run(
        [sys.executable, "-m", "rl.train", "--config", "configs/rl/tiny.yaml",
         "--dataset_dir", str(data / "rl_states"), "--model_name_or_path", str(sft_out / "merged"),
         "--output_dir", str(rl_out), "--max_steps", str(rl_steps)]
    )  # fmt: skip
    r = json.loads((rl_out / "rl_summary.json").read_text())
    return [
        {
            "name": "sft_tiny_tokens_per_s",
            "figure": _tokens_per_s(s),
            "unit": "training tokens/s (tiny recipe, CPU)",
            "target": "report",
            "met": None,
            "inputs": {"steps": sft_steps, "recipe": "configs/sft/tiny.yaml"},
            "extra": {"process_wall_s": round(wall, 1), "peak_rss_mib": round(peak / 2**20), "summary": s},
        },
        real_sft(work, data, real_steps),
        {
            "name": "grpo_tiny_s_per_step",
            "figure": round(r["s_per_step"], 2),  # trainer wall time / steps (model loading excluded)
            "unit": "s/GRPO step (tiny recipe, CPU)",
            "target": "report",
            "met": None,
            "inputs": {"steps": rl_steps, "recipe": "configs/rl/tiny.yaml"},
            "extra": {"process_wall_s": round(rl_wall, 1), "peak_rss_mib": round(rl_peak / 2**20), "summary": r},
        },
    ]
