"""`make gpu-check` (bench/gpu_check.py) cannot rot: its CPU mode runs end to end here, through the same collect,
model build, sft.train and rl.train entry points as on a GPU, and its JSON carries every figure. The GPU mode itself
(27B layer dims on one H200) is the `gpu`-marked test at the bottom, deselected on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("s_per_step", "tokens_per_s", "mfu", "peak_memory_gib", "tokens_per_step")


def test_peak_table_matches_specific_names_first():
    table = dict(gpu_check.PEAK_BF16_FLOPS)
    pick = lambda name: next(f for k, f in gpu_check.PEAK_BF16_FLOPS if k in name)  # noqa: E731
    assert pick("NVIDIA H200") == table["H200"] == pick("NVIDIA H100 80GB HBM3")
    assert pick("NVIDIA H100 PCIe") == table["H100 PCIe"] < table["H100"]
    assert pick("NVIDIA H200 NVL") == table["H200 NVL"]
    assert pick("NVIDIA A100-SXM4-80GB") == 312e12
    assert not any(k in "NVIDIA L40S" for k, _ in gpu_check.PEAK_BF16_FLOPS)  # -> measured, labelled "unknown card"


def test_steady_state_leaves_out_warmup_steps():
    rows = [{"step": i, "t": t, "flos": 10.0 * i, "tokens": 100 * i} for i, t in enumerate([0.0, 5.0, 6.0, 7.0])]
    s = gpu_check.steady_state(rows, warmup=1)
    assert s["steps_measured"] == 2 and s["warmup_steps_excluded"] == 1
    assert s["s_per_step"] == pytest.approx(1.0) and s["tokens_per_s"] == pytest.approx(100.0)
    assert s["trainer_flops_per_s"] == pytest.approx(10.0)
    assert gpu_check.steady_state(rows[:2], warmup=2)["steps_measured"] == 1  # always keeps one measured step


def test_depth_fit_extrapolation_is_labelled_and_linear():
    full = {"total": 64_000, "non_embedding": 60_000}
    runs = [
        {"layers": 4, "s_per_step": 1.0 + 4 * 0.5, "peak_memory_gib": 10 + 4 * 2.0, "memory_kind": "cuda x",
         "tokens_per_step": 1000, "params_total": 8000, "params_non_embedding": 4000},
        {"layers": 8, "s_per_step": 1.0 + 8 * 0.5, "peak_memory_gib": 10 + 8 * 2.0, "memory_kind": "cuda x",
         "tokens_per_step": 1000, "params_total": 12000, "params_non_embedding": 8000},
    ]  # fmt: skip
    ex = gpu_check.extrapolate(runs, full, peak_flops=1e6, weight_bytes=2)
    assert ex["label"].startswith("EXTRAPOLATION") and "not measured" in ex["label"]
    assert ex["method"] == "linear fit in depth"
    assert ex["s_per_step"] == pytest.approx(1.0 + 64 * 0.5)
    assert ex["peak_memory_gib"] == pytest.approx(10 + 64 * 2.0)
    assert ex["mfu"] == pytest.approx(6 * 60_000 * 1000 / 33.0 / 1e6)
    one = gpu_check.extrapolate(runs[:1], full, peak_flops=1e6, weight_bytes=2)
    assert one["method"].startswith("non-embedding parameter ratio")
    assert one["s_per_step"] == pytest.approx(3.0 * 60_000 / 4000)


def test_kernels_report_names_what_transformers_bound():
    rep = gpu_check.kernels_report()
    bound = rep["qwen3_5_bound"]
    assert set(bound) == {
        "chunk_gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "causal_conv1d_fn",
        "causal_conv1d_update",
    }
    assert all(v != "unknown" for v in bound.values()), bound
    assert {"gated_delta_rule_fla", "padding_free_linear_attention", "fla_hopper_triton_ok"} <= set(rep["fast_paths"])
    if not rep["cuda_available"]:  # CI: the torch reference paths, and the notes say so
        assert bound["chunk_gated_delta_rule"].startswith("transformers.models.qwen3_5.")
        assert rep["fast_paths"]["gated_delta_rule_fla"] is False and rep["notes"]


def _report(mode: str) -> dict:
    """A report shaped like run_check's, with an MFU and an extrapolation in every stage (the CPU JSON has both)."""
    ex = {"label": "EXTRAPOLATION to 64 layers from measured depths [4] (not measured)", "method": "m",
          "s_per_step": 9.0, "mfu": 0.2, "peak_memory_gib": 99.0}  # fmt: skip
    rec = {"s_per_step": 0.5, "tokens_per_s": 1000.0, "mfu": 0.37, "peak_memory_gib": 1.5, "extrapolation": ex}
    return {
        "mode": mode,
        "peak": {"card": "x86_64", "peak_flops": 1e11, "peak_source": "measured"},
        "stages": {"sft": dict(rec), "rl": dict(rec)},
        "kernels": {"fast_paths": {}, "notes": []},
        "json": "OUT/gpu_check.json",
        "wall_s": 1.0,
    }


def test_cpu_run_says_first_that_it_is_not_a_gpu_run_and_prints_no_mfu(monkeypatch, capsys, tmp_path):
    """Without CUDA, the first line of `make gpu-check` says it is not a GPU run, and no MFU or 64-layer
    extrapolation is printed (the JSON still has them)."""
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check, "run_check", lambda out, **kw: calls.append(kw) or _report("cpu"))
    assert gpu_check.main(["--device", "auto", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    first, *rest = out.splitlines()
    assert calls and first == gpu_check.NOT_A_GPU_RUN
    rest = "\n".join(rest)
    assert "MFU" not in rest and "EXTRAPOLATION" not in rest and "%" not in rest, rest
    assert "0.500 s/step" in out  # the stage lines are still there


def test_gpu_run_prints_mfu_and_the_extrapolation(capsys):
    gpu_check.print_table(_report("gpu"))
    out = capsys.readouterr().out
    assert not out.startswith(gpu_check.NOT_A_GPU_RUN)
    assert "MFU 37.0%" in out and "EXTRAPOLATION to 64 layers" in out and "MFU ~20.0%" in out


@pytest.mark.slow
def test_cpu_mode_end_to_end_writes_every_figure(tmp_path):
    """`python -m bench.gpu_check --device cpu` (= `make gpu-check DEVICE=cpu`): collect -> Qwen3.5 hybrid build ->
    sft.train at 4 and 8 layers -> rl.train on the merged SFT model -> JSON with positive figures."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--out", str(tmp_path / "gc")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    rep = json.loads((tmp_path / "gc" / "gpu_check.json").read_text())
    assert rep["mode"] == "cpu" and rep["peak"]["peak_flops"] > 0 and "measured" in rep["peak"]["peak_source"]
    assert rep["model"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert rep["model"]["params_full_depth"]["total"] > rep["model"]["params"]["total"] > 0
    assert rep["data"]["sft_rows"]["train"] > 0
    for name in ("sft", "rl"):
        rec = rep["stages"][name]
        assert "error" not in rec, rec.get("error")
        for k in FIGURES:
            assert rec[k] is not None and rec[k] > 0, (name, k, rec[k])
        assert rec["steps_measured"] >= 1
        ex = rec["extrapolation"]
        assert ex["label"].startswith("EXTRAPOLATION") and ex["layers"] == 64
        assert ex["s_per_step"] > rec["s_per_step"] and ex["tokens_per_s"] > 0
        # every GPU-only key is off in CPU mode
        argv = " ".join(rec["argv"])
        assert "--bf16 false" in argv and "--use_cpu true" in argv and "--gradient_checkpointing false" in argv
    assert "--packing false" in " ".join(rep["stages"]["sft"]["argv"])
    assert "--use_vllm false" in " ".join(rep["stages"]["rl"]["argv"])
    assert [d["layers"] for d in rep["stages"]["sft"]["at_other_depths"]] == [8]
    assert rep["stages"]["sft"]["extrapolation"]["method"] in (
        "linear fit in depth",
        "non-embedding parameter ratio (same MFU)",  # if timing noise made the per-layer time non-positive
    )
    assert rep["stages"]["sft"]["entry_point_summary"]["steps"] == rep["stages"]["sft"]["steps_total"]
    assert rep["stages"]["rl"]["policy"].endswith("merged")  # GRPO starts from the SFT stage's merged model
    lines = r.stdout.splitlines()
    assert lines[0] == gpu_check.NOT_A_GPU_RUN, lines[:3]  # said first, before any figure
    assert "MFU" not in "\n".join(lines[1:]) and "EXTRAPOLATION" not in r.stdout, r.stdout
    assert rep["stages"]["sft"]["mfu"] > 0  # the JSON keeps every figure


@pytest.mark.gpu
def test_gpu_mode_at_27b_layer_dims(tmp_path):
    """The real check (one H200: ~5-8 min). Asserts that it ran, not how fast: the figures are in the JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--device", "cuda", "--out", str(tmp_path / "gc")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    rep = json.loads((tmp_path / "gc" / "gpu_check.json").read_text())
    assert r.returncode == 0, json.dumps({k: v.get("error") for k, v in rep["stages"].items()})
    assert rep["model"]["dims"]["hidden_size"] == 5120
    for rec in rep["stages"].values():
        assert rec["mfu"] > 0 and rec["peak_memory_gib"] > 0
