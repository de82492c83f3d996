"""GPU-node checks: deselected on CPU by the default `-m "not gpu and not vllm"`; skipped without CUDA or vLLM.

Run on a GPU node after `make gpu-setup` (the set pinned in constraints/gpu.txt):
    .venv/bin/python -m pytest -q -m "gpu or vllm" tests/test_gpu.py
They use the tiny model, so they need no downloaded weights."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collect import teacher_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, recorded_correct_runs) -> Path:
    from collect.harvest import harvest

    d = tmp_path_factory.mktemp("gpu-data")
    teacher_runs.write_trajectories(d / "trajectories.jsonl", recorded_correct_runs)
    harvest(d / "trajectories.jsonl", d, eval_share=0.2)
    return d


@pytest.mark.gpu
def test_sft_entry_script_trains_in_bf16_on_cuda_and_merges(tmp_path, data_dir):
    import torch

    out = tmp_path / "sft"
    r = subprocess.run(
        [sys.executable, "-m", "sft.train", "--config", "configs/sft/tiny_lora.yaml", "--dataset_dir",
         str(data_dir / "sft"), "--output_dir", str(out), "--max_steps", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == 5 and summary["losses"]
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.bfloat16).to("cuda")
    assert next(merged.parameters()).device.type == "cuda"


@pytest.mark.vllm
@pytest.mark.gpu
def test_vllm_serves_the_tiny_checkpoint_with_tool_calls(tiny_model):
    """The command serve.vllm builds really starts vLLM, which answers the openai client on /v1."""
    import openai

    from serve.vllm import VLLMServeConfig, build_vllm_command, wait_until_ready

    cfg = VLLMServeConfig(
        model=str(tiny_model), family="qwen3", port=18931, served_model_name="tiny", max_model_len=2048
    )
    cmd = build_vllm_command(cfg)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    try:
        wait_until_ready(f"http://127.0.0.1:{cfg.port}/v1", timeout_s=600, proc=proc)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{cfg.port}/v1", api_key="none")
        t0 = time.time()
        resp = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "find the founding year"}], max_tokens=16
        )
        assert resp.usage.prompt_tokens > 0 and time.time() - t0 < 60
        assert resp.model == "tiny"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
