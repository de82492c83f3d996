"""`make gpu-check`: the SFT and GRPO recipes of Qwen3.5-27B at its real layer dimensions, on one GPU, offline.

    python -m bench.gpu_check [--device auto|cuda|cpu] [--out runs/gpu_check] [--layers 4] [--sft-steps N] ...

What it does, in order (docs/gpu_check.md has the why, the wheels and the figures to expect):
  1. `kernels_report()`: which fast paths transformers will take for Qwen3.5's linear attention (flash-linear-attention
     for the gated delta rule, causal-conv1d for the short convolution) and whether the installed Triton is one that
     flash-linear-attention accepts on Hopper;
  2. data: the real collect stage on the embedded world (`python -m collect --split train --limit 8`, which harvests
     OUT/sft and OUT/rl_states); fast and offline;
  3. model: a random-initialised Qwen3.5 text model with the 27B layer dimensions (hidden 5120, 24/4 attention heads x
     256, linear attention 16 key / 48 value heads x 128, FFN 17408, vocab 248320) and a few layers in the real hybrid
     pattern (3 linear-attention layers, then 1 full-attention layer), saved with the tiny local tokenizer of sft.tiny;
     on CPU the same pattern at tiny dimensions;
  4. SFT: `sft.train.main` with `--config configs/sft/qwen3_5_27b.yaml` and overrides (model path, steps, output dir
     and, on GPU, the speed settings recommended in docs/gpu_check.md: BFD packing = padding-free, micro-batch 2);
  5. GRPO: `rl.train.main` with `--config configs/rl/qwen3_5_27b.yaml`, on the SFT stage's merged checkpoint, with the
     offline judge (no endpoint), HF generation unless `--vllm colocate`;
  6. JSON (OUT/gpu_check.json): per stage tokens/s, MFU, peak memory, s/step (steady state: the first
     `--warmup-steps` steps, with Triton autotuning and compilation, are left out), and an EXTRAPOLATION to the full
     64-layer depth, labelled as such.

The stages are the project's entry points, run in this process (for the peak-memory counters); their
`build_trainer` is wrapped only to attach a timing callback to the trainer they build. CPU mode (`--device cpu`, or
auto without CUDA) overrides every GPU-only key (bf16, packing/padding-free, vLLM, gradient checkpointing) and runs in
CI (tests/test_gpu_check.py) so that this script cannot rot. Speed figures go to the JSON only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import importlib
import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from collect import jsonio
from collect.cli import run_cli
from sft.tiny import default_texts, save_checkpoint, train_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
SFT_RECIPE = "configs/sft/qwen3_5_27b.yaml"
RL_RECIPE = "configs/rl/qwen3_5_27b.yaml"
FULL_DEPTH = 64  # Qwen3.5-27B: 64 decoder layers (48 linear-attention + 16 full-attention)
MFU_TARGET = 0.35  # issue 14 item 7: LoRA SFT at the 27B layer dims on one H200

# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) from the vendors' datasheets. The first substring of the
# device name that matches wins, so the specific names come before the generic ones.
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("H200 NVL", 835e12),
    ("H200", 989.4e12),  # SXM: the H100 SXM's rate
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),  # SXM
    ("A100", 312e12),
]


@dataclass
class Dims:
    """Qwen3_5TextConfig fields (transformers 5.24) that set the model's size."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    vocab_size: int


# Qwen3.5-27B's text model (64 layers, one full-attention layer in every 4)
DIMS_27B = Dims(
    hidden_size=5120,
    intermediate_size=17408,
    num_attention_heads=24,
    num_key_value_heads=4,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    vocab_size=248320,
)
# CPU mode: the same hybrid pattern and head ratios, tiny widths (vocab = the tiny tokenizer's, set at build time)
DIMS_TINY = Dims(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    vocab_size=0,
)


# ---------------------------------------------------------------------------------------------------------------------
# 1. kernels


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _resolved_impl(fn) -> str:
    """Module of the implementation transformers bound behind a `use_kernel_func_from_hub_with_fallback` function."""
    seen = 0
    while fn is not None and seen < 8:
        closure = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()), strict=False))
        impl = closure.get("implementation")
        if impl is not None:
            return f"{impl.__module__}.{impl.__qualname__}"
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return "unknown"


def kernels_report() -> dict:
    """Which fast paths Qwen3.5's linear attention gets here, and why not where it doesn't.

    Reads what transformers itself bound (the `implementation` behind the gated-delta-rule and causal-conv1d
    functions of models/qwen3_5), the installed versions, and flash-linear-attention's Hopper rule: its gated
    backward kernel refuses Triton >= 3.4.0 and < 3.7.1 on Hopper (wrong results, fla issue #640) unless tilelang is
    installed."""
    import torch
    from packaging.version import Version

    cuda = torch.cuda.is_available()
    cap = torch.cuda.get_device_capability(0) if cuda else None
    hopper = cap is not None and cap[0] == 9
    rep: dict = {
        "torch": torch.__version__,
        "cuda_available": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else None,
        "compute_capability": f"{cap[0]}.{cap[1]}" if cap else None,
        "versions": {
            d: _version(d)
            for d in (
                "transformers",
                "trl",
                "peft",
                "triton",
                "flash-linear-attention",
                "fla-core",
                "causal-conv1d",
                "tilelang",
                "liger-kernel",
                "flash-attn",
                "vllm",
                "deepspeed",
            )
        },
    }
    try:
        from transformers.utils import import_utils as iu

        rep["transformers_probes"] = {
            "is_flash_linear_attention_available": bool(iu.is_flash_linear_attention_available()),
            "is_causal_conv1d_available": bool(iu.is_causal_conv1d_available()),
        }
    except Exception as e:  # pragma: no cover - depends on the transformers version
        rep["transformers_probes"] = {"error": repr(e)}
    try:
        q35 = importlib.import_module("transformers.models.qwen3_5.modeling_qwen3_5")
        bound = {
            "chunk_gated_delta_rule": _resolved_impl(q35.torch_chunk_gated_delta_rule),
            "fused_recurrent_gated_delta_rule": _resolved_impl(q35.torch_recurrent_gated_delta_rule),
            "causal_conv1d_fn": _resolved_impl(q35.causal_conv1d_fn),
            "causal_conv1d_update": _resolved_impl(q35.causal_conv1d_update),
        }
    except Exception as e:  # pragma: no cover
        bound = {"error": repr(e)}
    rep["qwen3_5_bound"] = bound
    fla_fast = str(bound.get("chunk_gated_delta_rule", "")).startswith("fla.")
    conv_fast = str(bound.get("causal_conv1d_fn", "")).startswith("causal_conv1d")
    triton_v = rep["versions"]["triton"]
    bad_range = bool(triton_v) and Version("3.4.0") <= Version(triton_v.split("+")[0]) < Version("3.7.1")
    triton_bad_on_hopper = bad_range and not _version("tilelang")
    rep["fast_paths"] = {
        # fla's Triton kernels for the gated delta rule (prefill/training chunk kernel and decode recurrent kernel)
        "gated_delta_rule_fla": fla_fast and cuda,
        # packed / padding-free batches: only fla keeps the rows apart in the delta rule (cu_seqlens); the torch path
        # raises. The short convolution is NOT kept apart by either path (transformers passes no seq_idx).
        "padding_free_linear_attention": fla_fast and cuda,
        "causal_conv1d_cuda": conv_fast and cuda,
        "fla_hopper_triton_ok": (not hopper) or not triton_bad_on_hopper,
        "liger_kernel": _version("liger-kernel") is not None,
        "flash_attn": _version("flash-attn") is not None,
    }
    notes = []
    if not fla_fast:
        notes.append("flash-linear-attention missing: the gated delta rule runs its slow torch reference and packed /")
        notes.append("padding-free batches fail; install the `gpu` extra (docs/gpu_check.md)")
    if hopper and triton_bad_on_hopper:
        notes.append(f"Triton {triton_v} on Hopper: fla refuses its gated backward (>=3.4.0,<3.7.1); use >=3.7.1")
    if not conv_fast:
        notes.append("causal-conv1d missing: the short convolution runs torch's conv1d (correct, somewhat slower)")
    rep["notes"] = notes
    return rep


# ---------------------------------------------------------------------------------------------------------------------
# 2.-3. data and model


def collect_data(work: Path, limit: int) -> Path:
    """The real collect stage (teacher on the embedded world) + its harvest into OUT/sft and OUT/rl_states."""
    out = work / "collect"
    if not (out / "sft").exists() or not (out / "rl_states").exists():
        cmd = [sys.executable, "-m", "collect", "--config", "configs/collect/embedded.yaml", "--split", "train"]
        cmd += ["--limit", str(limit), "--out", str(out), "--no-progress", "--overwrite"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"collect failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return out


def qwen3_5_config(dims: Dims, num_layers: int, tok):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        **asdict(dims),
        num_hidden_layers=num_layers,  # layer_types default: every 4th layer full attention (the 27B pattern)
        tie_word_embeddings=False,  # as in Qwen3.5-27B
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=None,
    )


def count_params(cfg) -> dict:
    """Parameter counts of a config's model, built on the meta device (no memory)."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    with torch.device("meta"):
        m = Qwen3_5ForCausalLM(cfg)
    return {"total": m.num_parameters(), "non_embedding": m.num_parameters(exclude_embeddings=True)}


def build_model(out: Path, dims: Dims, num_layers: int, device: str, seed: int = 0) -> tuple[Path, dict]:
    """Random Qwen3.5 text model + the tiny tokenizer, saved to `out` (bf16 on GPU, fp32 on CPU)."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    t0 = time.perf_counter()
    tok = train_tokenizer(default_texts(seed))
    if dims.vocab_size < len(tok):  # CPU mode: the tokenizer's size, rounded up like real vocabularies
        dims = Dims(**{**asdict(dims), "vocab_size": -(-len(tok) // 64) * 64})
    cfg = qwen3_5_config(dims, num_layers, tok)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3_5ForCausalLM._from_config(cfg, dtype=dtype)
    save_checkpoint(model, tok, out)
    info = {
        "path": str(out),
        "layers": num_layers,
        "layer_types": list(cfg.layer_types),
        "dims": asdict(dims),
        "dtype": str(dtype).replace("torch.", ""),
        "params": count_params(cfg),
        "params_full_depth": count_params(qwen3_5_config(dims, FULL_DEPTH, tok)),
        "tokenizer_size": len(tok),
        "build_s": round(time.perf_counter() - t0, 1),
    }
    del model
    _free()
    return out, info


# ---------------------------------------------------------------------------------------------------------------------
# 4.-5. stages


def _free() -> None:
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepClock:
    """Trainer callback: wall time, cumulative trainer FLOPs and tokens at the end of every optimizer step."""

    def __init__(self):
        self.trainer = None
        self.rows: list[dict] = []

    def callback(self):
        from transformers import TrainerCallback

        clock = self

        class _CB(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                _sync()
                clock.rows = [{"step": 0, "t": time.perf_counter(), "flos": 0.0, "tokens": 0}]

            def on_step_end(self, args, state, control, **kw):
                _sync()
                tr = clock.trainer
                tokens = getattr(tr, "_total_train_tokens", 0) or state.num_input_tokens_seen or 0
                flos = float(state.total_flos) + float(getattr(tr, "current_flos", 0.0))
                row = {"step": state.global_step, "t": time.perf_counter(), "flos": flos, "tokens": tokens}
                clock.rows.append(row)

        return _CB()


@contextlib.contextmanager
def clocked(module, clock: StepClock):
    """Wrap `module.build_trainer` so the trainer the entry point builds carries `clock`'s callback."""
    original = module.build_trainer

    def wrapper(*a, **kw):
        built = original(*a, **kw)
        trainer = built[0]
        clock.trainer = trainer
        trainer.add_callback(clock.callback())
        return built

    module.build_trainer = wrapper
    try:
        yield
    finally:
        module.build_trainer = original


def _peak_memory_reset() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _peak_memory() -> dict:
    import resource

    import torch

    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    if torch.cuda.is_available():
        return {
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
            "memory_kind": "cuda max_memory_allocated during the stage",
        }
    return {"peak_memory_gib": round(rss_gib, 3), "memory_kind": "process peak RSS so far (CPU; not per stage)"}


def steady_state(rows: list[dict], warmup: int) -> dict:
    """Figures over the steps after the first `warmup` (autotuning, compilation, allocator growth)."""
    steps = len(rows) - 1
    w = min(warmup, max(0, steps - 1))  # keep at least one measured step
    a, b = rows[w], rows[-1]
    dt_s = b["t"] - a["t"]
    n = b["step"] - a["step"]
    return {
        "steps_total": steps,
        "steps_measured": n,
        "warmup_steps_excluded": w,
        "s_per_step": dt_s / n if n else None,
        "tokens_per_s": (b["tokens"] - a["tokens"]) / dt_s if dt_s > 0 else None,
        "trainer_flops_per_s": (b["flos"] - a["flos"]) / dt_s if dt_s > 0 else None,
        "tokens_per_step": (b["tokens"] - a["tokens"]) / n if n else None,
        "all_steps_s": (rows[-1]["t"] - rows[0]["t"]),
    }


def peak_flops(device: str) -> dict:
    """The card's dense bf16 peak from PEAK_BF16_FLOPS, or 'unknown'; on CPU (and unknown cards, as a fallback for
    the MFU figure) a measured matmul rate, labelled as measured."""
    import torch

    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        for key, flops in PEAK_BF16_FLOPS:
            if key in name:
                return {"card": name, "peak_flops": flops, "peak_source": f"datasheet dense bf16 ({key})"}
        dtype, dev, n = torch.bfloat16, "cuda", 8192
    else:
        name = platform.processor() or platform.machine()
        dtype, dev, n = torch.float32, "cpu", 512
    a = torch.randn(n, n, dtype=dtype, device=dev)
    b = torch.randn(n, n, dtype=dtype, device=dev)
    (a @ b).sum().item()
    reps = 20 if dev == "cuda" else 10
    _sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        c = a @ b
    _sync()
    rate = 2 * n**3 * reps / (time.perf_counter() - t0)
    del a, b, c
    return {
        "card": name,
        "peak_flops": rate,
        "peak_source": f"unknown card: measured {str(dtype).replace('torch.', '')} {n}x{n} matmul rate (not a "
        "datasheet peak)",
    }


# LoRA on every decoder layer: the full-attention projections AND the linear-attention ones (transformers 5.24
# names: in_proj_qkv, in_proj_z, out_proj; in_proj_a/b are 48-wide and left out). With the recipe's attention-only
# list only 1 layer in 4 is adapted, and in a 4-layer model that layer is the last one: the backward pass would stop
# there and the check would time a forward pass, while at 64 layers the backward runs through 61 of them.
LORA_ALL_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj"]


def sft_argv(
    base: Path, data: Path, out: Path, device: str, steps: int, merge: bool = True, packing: bool = True
) -> list[str]:
    argv = ["--config", SFT_RECIPE, "--model_name_or_path", str(base), "--dataset_dir", str(data / "sft")]
    argv += ["--output_dir", str(out), "--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no"]
    argv += ["--eval_strategy", "no", "--report_to", "none", "--merge", str(merge).lower()]
    argv += ["--lora_target_modules", *LORA_ALL_LAYERS]
    if device == "cuda" and not packing:
        # no packing / padding-free (e.g. without flash-linear-attention, whose torch reference refuses packed rows)
        argv += ["--packing", "false", "--padding_free", "false", "--per_device_train_batch_size", "2"]
        argv += ["--gradient_accumulation_steps", "1"]
    elif device == "cuda":
        # the speed settings recommended for the recipe (docs/gpu_check.md): BFD packing to max_length (TRL turns on
        # padding-free: one flattened row per micro-batch, cu_seqlens to fla), two packed rows per micro-batch,
        # gradient accumulation 1 (the check measures steps, not a training run)
        argv += ["--packing", "true", "--packing_strategy", "bfd", "--padding_free", "true"]
        argv += ["--per_device_train_batch_size", "2"]
        argv += ["--gradient_accumulation_steps", "1"]
    else:
        # CPU: every GPU-only key off (bf16, packing / padding-free: fla-only; gradient checkpointing)
        argv += ["--bf16", "false", "--use_cpu", "true", "--dtype", "float32", "--packing", "false"]
        argv += ["--padding_free", "false", "--gradient_checkpointing", "false", "--max_length", "2048"]
        argv += ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1"]
        argv += ["--attn_implementation", "sdpa", "--dataloader_num_workers", "0"]
    return argv


def rl_argv(policy: Path, data: Path, out: Path, device: str, steps: int, vllm: str) -> list[str]:
    argv = ["--config", RL_RECIPE, "--model_name_or_path", str(policy), "--dataset_dir", str(data / "rl_states")]
    argv += ["--output_dir", str(out), "--max_steps", str(steps), "--logging_steps", "1", "--save_strategy", "no"]
    argv += ["--report_to", "none", "--judge", json.dumps({"kind": "offline"})]  # no judge endpoint here
    if device == "cuda":
        if vllm == "colocate":
            argv += ["--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.3"]
        else:
            argv += ["--use_vllm", "false"]  # HF generate: no vLLM server on a one-GPU check
    else:
        argv += ["--bf16", "false", "--use_cpu", "true", "--dtype", "float32", "--use_vllm", "false"]
        argv += ["--gradient_checkpointing", "false", "--num_generations", "2", "--per_device_train_batch_size", "2"]
        argv += ["--gradient_accumulation_steps", "1", "--max_completion_length", "8", "--max_train_samples", "4"]
        argv += ["--dataloader_num_workers", "0"]
    return argv


def run_stage(name: str, module_name: str, call, warmup: int, peak: dict, rec_extra: dict) -> dict:
    """Run one entry point with the step clock attached; figures + the entry point's own summary."""
    module = importlib.import_module(module_name)
    clock = StepClock()
    _free()
    _peak_memory_reset()
    t0 = time.perf_counter()
    with clocked(module, clock):
        summary = call(module)
    wall = time.perf_counter() - t0
    rec: dict = {"stage": name, "process_wall_s": round(wall, 1), **rec_extra}
    rec.update(steady_state(clock.rows, warmup))
    rec.update(_peak_memory())
    fl = rec.get("trainer_flops_per_s")
    rec["mfu"] = fl / peak["peak_flops"] if fl and peak.get("peak_flops") else None
    rec["entry_point_summary"] = summary
    clock.trainer = None
    _free()
    return rec


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of value = intercept + slope * layers."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def extrapolate(runs: list[dict], params_full: dict, peak_flops: float, weight_bytes: int) -> dict:
    """Full-depth (64-layer) figures from runs at a few depths. An EXTRAPOLATION, not a measurement.

    With two or more depths (the SFT stage on GPU: 4 and 8 layers): s/step and peak memory are fitted as
    intercept + slope * layers (the intercept is the embedding, the LM head, the loss and the optimizer step; the
    slope one decoder layer in the 3:1 hybrid mix) and read at 64; tokens/step stay as measured. With one depth: s/step
    and tokens/s scale with the non-embedding parameters (same MFU assumed) and memory = the full model's weights +
    the measured rest scaled by depth (an overestimate: logits and embedding/LM-head states do not grow with depth)."""
    ref = runs[0]
    out: dict = {
        "label": f"EXTRAPOLATION to {FULL_DEPTH} layers from measured depths {[r['layers'] for r in runs]} "
        "(not measured)",
        "layers": FULL_DEPTH,
        "params_total": params_full["total"],
        "params_non_embedding": params_full["non_embedding"],
        "assumes": "same tokens per step as measured; ONE device, no ZeRO sharding",
    }
    if not ref.get("s_per_step"):
        return out
    cuda = str(ref.get("memory_kind", "")).startswith("cuda")
    fit_ok = False
    if len(runs) >= 2:
        a, b = line_fit([(r["layers"], r["s_per_step"]) for r in runs])
        fit_ok = b > 0
        out["s_per_step_fit"] = {"intercept_s": a, "per_layer_s": b}
        if fit_ok:
            out["method"] = "linear fit in depth"
            out["s_per_step"] = a + b * FULL_DEPTH
            if cuda:
                ma, mb = line_fit([(r["layers"], r["peak_memory_gib"]) for r in runs])
                out["peak_memory_gib"] = ma + mb * FULL_DEPTH
                out["peak_memory_fit"] = {"intercept_gib": ma, "per_layer_gib": mb}
        else:
            out["fit_note"] = "per-layer time not positive (noise larger than a layer's cost): parameter scaling used"
    if not fit_ok:
        ratio = params_full["non_embedding"] / ref["params_non_embedding"]
        out["method"] = "non-embedding parameter ratio (same MFU)"
        out["compute_ratio"] = ratio
        out["s_per_step"] = ref["s_per_step"] * ratio
        if cuda:
            w_meas = ref["params_total"] * weight_bytes / 2**30
            w_full = params_full["total"] * weight_bytes / 2**30
            out["peak_memory_gib"] = w_full + max(0.0, ref["peak_memory_gib"] - w_meas) * FULL_DEPTH / ref["layers"]
            out["memory_formula"] = "weights(64 layers) + (measured peak - measured weights) * 64/layers"
    if ref.get("tokens_per_step"):
        out["tokens_per_s"] = ref["tokens_per_step"] / out["s_per_step"]
        # the trainer's convention at full depth: 6 * N_non_embedding * tokens per step
        out["mfu"] = 6 * params_full["non_embedding"] * ref["tokens_per_step"] / out["s_per_step"] / peak_flops
    return out


# ---------------------------------------------------------------------------------------------------------------------
# 6. the whole check


def run_check(
    out: Path,
    device: str = "auto",
    layers: int = 4,
    fit_layers: int | None = None,
    sft_steps: int | None = None,
    rl_steps: int | None = None,
    warmup_steps: int | None = None,
    limit: int = 8,
    vllm: str = "off",
    stages: tuple[str, ...] = ("sft", "rl"),
    packing: bool = True,
) -> dict:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu or auto)")
    gpu = device == "cuda"
    sft_steps = sft_steps or (12 if gpu else 3)
    rl_steps = rl_steps or (4 if gpu else 2)
    warmup = warmup_steps if warmup_steps is not None else (2 if gpu else 1)
    fit_layers = 2 * layers if fit_layers is None else fit_layers
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()

    report: dict = {
        "what": "make gpu-check: SFT + GRPO recipes (project entry points) on a random Qwen3.5 at the 27B layer dims"
        if gpu
        else "make gpu-check, CPU mode: same code path at tiny dims, every GPU-only key off (not a speed figure)",
        "mode": "gpu" if gpu else "cpu",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "launcher": "single process, no accelerate launch / DeepSpeed",
        "recipes": {"sft": SFT_RECIPE, "rl": RL_RECIPE},
        "kernels": kernels_report(),
    }
    peak = report["peak"] = peak_flops(device)
    t0 = time.perf_counter()
    data = collect_data(out, limit)
    stats = json.loads((data / "harvest_stats.json").read_text())
    report["data"] = {"dir": str(data), "limit": limit, "sft_rows": stats.get("sft_rows")}
    report["data"]["s"] = round(time.perf_counter() - t0, 1)

    dims = DIMS_27B if gpu else DIMS_TINY
    base, model_info = build_model(out / "base", dims, layers, device)
    report["model"] = model_info
    wbytes = 2 if gpu else 4
    params_full = model_info["params_full_depth"]

    def depth_fields(info: dict) -> dict:
        return {
            "layers": info["layers"],
            "params_total": info["params"]["total"],
            "params_non_embedding": info["params"]["non_embedding"],
        }

    stages_out: dict = {}
    if "sft" in stages:
        argv = sft_argv(base, data, out / "sft", device, sft_steps, packing=packing)
        try:
            rec = run_stage(
                "sft", "sft.train", lambda m, v=argv: m.main(*m.parse_args(v)), warmup, peak,
                {"argv": argv, **depth_fields(model_info)},
            )  # fmt: skip
            runs = [rec]
            if fit_layers and fit_layers != layers:
                # the same SFT at a second depth, for the per-layer cost (no merge: only the timing is needed)
                base2, info2 = build_model(out / f"base_{fit_layers}", dims, fit_layers, device)
                argv2 = sft_argv(
                    base2, data, out / f"sft_{fit_layers}", device, sft_steps, merge=False, packing=packing
                )
                rec2 = run_stage(
                    "sft", "sft.train", lambda m, v=argv2: m.main(*m.parse_args(v)), warmup, peak,
                    {"argv": argv2, **depth_fields(info2)},
                )  # fmt: skip
                rec2.pop("entry_point_summary", None)
                for d in (base2, out / f"sft_{fit_layers}"):  # ~11 GB of weights at the 27B dims
                    shutil.rmtree(d, ignore_errors=True)
                rec["at_other_depths"] = [rec2]
                runs.append(rec2)
            if gpu:
                rec["mfu_target"] = MFU_TARGET
                rec["mfu_target_met_measured"] = rec["mfu"] is not None and rec["mfu"] >= MFU_TARGET
            rec["extrapolation"] = extrapolate(runs, params_full, peak["peak_flops"], wbytes)
            if gpu and rec["extrapolation"].get("mfu") is not None:
                rec["mfu_target_met_extrapolated"] = rec["extrapolation"]["mfu"] >= MFU_TARGET
            stages_out["sft"] = rec
        except Exception as e:  # a failed stage is reported, the next one still runs
            stages_out["sft"] = {"stage": "sft", "error": repr(e)[-2000:], "argv": argv}
    if "rl" in stages:
        merged = out / "sft" / "merged"
        policy = merged if (merged / "config.json").exists() else base
        argv = rl_argv(policy, data, out / "rl", device, rl_steps, vllm)
        try:
            rec = run_stage(
                "rl", "rl.train", lambda m, v=argv: m.main(v), warmup, peak,
                {"argv": argv, "policy": str(policy), **depth_fields(model_info)},
            )  # fmt: skip
            # TRL's trainer counts no FLOPs for GRPO batches: MFU from an explicit approximation instead
            rec.pop("trainer_flops_per_s", None)
            n = model_info["params"]["non_embedding"]
            tps = rec.get("tokens_per_s")
            beta = float((rec["entry_point_summary"].get("config") or {}).get("grpo", {}).get("beta") or 0.0)
            per_token = (6 + (2 if beta else 0) + 2) * n
            rec["flops_formula"] = "(6 train + 2 reference (beta>0) + 2 generation) * N_non_embedding per token seen"
            rec["mfu"] = tps * per_token / peak["peak_flops"] if tps else None
            rec["mfu_kind"] = "approximate (formula above), not trainer FLOPs"
            rec["generation"] = "vllm colocate" if (gpu and vllm == "colocate") else "transformers generate"
            rec["extrapolation"] = extrapolate([rec], params_full, peak["peak_flops"], wbytes)
            rec["extrapolation"].pop("mfu", None)  # the 6N convention does not apply to a GRPO step
            stages_out["rl"] = rec
        except Exception as e:
            stages_out["rl"] = {"stage": "rl", "error": repr(e)[-2000:], "argv": argv}
    report["stages"] = stages_out
    report["wall_s"] = round(time.perf_counter() - t_all, 1)
    path = out / "gpu_check.json"
    jsonio.write_json(path, report, default=str)
    report["json"] = str(path)
    return report


NOT_A_GPU_RUN = (
    "gpu-check: NOT A GPU RUN (no CUDA device, or --device cpu): the CPU mode checks that the script still works at "
    "tiny dims; it measures no MFU and no GPU speed"
)


def print_table(report: dict) -> None:
    """The summary. In CPU mode: no MFU and no 64-layer extrapolation (they are GPU figures; the JSON keeps them)."""
    gpu = report["mode"] == "gpu"
    if gpu:
        print(f"gpu-check (gpu): {report['peak']['card']}, peak {report['peak']['peak_flops'] / 1e12:.3g} "
              f"TFLOP/s ({report['peak']['peak_source']})")  # fmt: skip
    else:
        print(f"gpu-check (cpu, not a GPU run): {report['peak']['card']}")
    for name, rec in report["stages"].items():
        if "error" in rec:
            print(f"  {name}: ERROR {rec['error'][:300]}")
            continue
        mfu = (f", MFU {100 * rec['mfu']:.1f}%" if rec.get("mfu") is not None else ", MFU n/a") if gpu else ""
        print(f"  {name}: {rec['s_per_step']:.3f} s/step, {rec['tokens_per_s']:.0f} tokens/s{mfu}, "
              f"peak {rec['peak_memory_gib']:.2f} GiB")  # fmt: skip
        ex = rec.get("extrapolation") or {}
        if gpu and ex.get("s_per_step"):
            mem = f", ~{ex['peak_memory_gib']:.0f} GiB on one device" if ex.get("peak_memory_gib") else ""
            mfu = f", MFU ~{100 * ex['mfu']:.1f}%" if ex.get("mfu") else ""
            print(f"    {ex['label']}, {ex['method']}: ~{ex['s_per_step']:.2f} s/step{mfu}{mem}")
    print(f"  kernels: {report['kernels']['fast_paths']}")
    for n in report["kernels"]["notes"]:
        print(f"    note: {n}")
    print(f"  -> {report['json']} ({report['wall_s']} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--out", default="runs/gpu_check", help="work folder; the report is OUT/gpu_check.json")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (4 = 3 linear + 1 full attention)")
    ap.add_argument("--fit-layers", type=int, default=None, help="second SFT depth for the per-layer fit (2x; 0=off)")
    ap.add_argument("--sft-steps", type=int, default=None, help="default 12 on GPU, 3 on CPU")
    ap.add_argument("--rl-steps", type=int, default=None, help="default 4 on GPU, 2 on CPU")
    ap.add_argument("--warmup-steps", type=int, default=None, help="steps left out of the figures (2 GPU, 1 CPU)")
    ap.add_argument("--limit", type=int, default=8, help="embedded train tasks to collect")
    ap.add_argument("--vllm", choices=["off", "colocate"], default="off", help="GRPO generation through vLLM")
    ap.add_argument("--stages", default="sft,rl", help="comma list of sft,rl")
    ap.add_argument("--no-packing", action="store_true", help="GPU SFT without BFD packing / padding-free")
    ap.add_argument("--kernels-only", action="store_true", help="print kernels_report() and exit")
    a = ap.parse_args(argv)
    import torch

    gpu = a.device == "cuda" or (a.device == "auto" and torch.cuda.is_available())
    if not gpu:  # said first, before any figure (stderr with --kernels-only, whose stdout is JSON)
        print(NOT_A_GPU_RUN, file=sys.stderr if a.kernels_only else sys.stdout, flush=True)
    if a.kernels_only:
        print(jsonio.dumps(kernels_report(), nonfinite="string", indent=1))
        return 0
    report = run_check(
        Path(a.out),
        device=a.device,
        layers=a.layers,
        fit_layers=a.fit_layers,
        sft_steps=a.sft_steps,
        rl_steps=a.rl_steps,
        warmup_steps=a.warmup_steps,
        limit=a.limit,
        vllm=a.vllm,
        stages=tuple(s.strip() for s in a.stages.split(",") if s.strip()),
        packing=not a.no_packing,
    )
    print_table(report)
    return 1 if any("error" in r for r in report["stages"].values()) else 0


if __name__ == "__main__":
    run_cli(main, "the figures measured so far are in OUT/gpu_check.json")
