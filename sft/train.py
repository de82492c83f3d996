"""State-SFT of the planner with TRL's SFTTrainer (paper v3: supervised warm start on judged-correct ledger states).

    python -m sft.train --config configs/sft/tiny.yaml [--dataset_dir DATA/sft] [--output_dir OUT]
    accelerate launch --config_file configs/accelerate/zero3.yaml -m sft.train --config configs/sft/qwen3_5_27b.yaml

Reads top to bottom:
  1. parse the YAML recipe into (SFTScriptArguments, trl.SFTConfig, trl.ModelConfig) with trl.TrlParser;
  2. pick the device setup: bf16 on CUDA, fp32 + use_cpu on CPU (where TRL's fused LM head is told to score only
     the labelled positions, sft/lm_head.py);
  3. build the tiny model into OUT/base when the recipe asks for it and the model path does not exist;
  4. load the harvested prompt-completion dataset (DATA/sft, from collect.harvest) -> loss on the completion only;
  5. train (LoRA through PEFT when use_peft, else a full fine-tune);
  6. save: LoRA adapter in OUT (training module names: loads onto the training class, rl/train.py), the same adapter
     with the base checkpoint's module names in OUT/vllm_adapter (what vLLM and PEFT-on-the-original-class apply),
     then a standalone merged checkpoint in OUT/merged (merge_and_unload) written in the base checkpoint's own key
     layout and config (see `to_base_layout`); for a full fine-tune OUT/merged is the trained model, same layout rule;
  7. write OUT/train_summary.json (steps, train time, losses, the one final eval, where LoRA landed, and digests of
     the inputs with the host, `run_fingerprints`, for comparing runs across machines).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models are local paths
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from datasets import DatasetDict, load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from collect import jsonio
from collect.cli import run_cli
from collect.harvest import message_features, template_messages
from sft.lm_head import compact_lm_head_on_cpu, expose_thinker_backbone
from sft.segment_cache import segment_cached
from sft.tiny import build_tiny_model

logger = logging.getLogger(__name__)

SFT_COLUMNS = ["prompt", "completion", "tools"]


@dataclass
class SFTScriptArguments:
    """Stage options that are neither training hyper-parameters (SFTConfig) nor model options (ModelConfig)."""

    dataset_dir: str = field(
        default="runs/data/sft", metadata={"help": "DatasetDict saved by collect.harvest (DATA/sft) with train/eval"}
    )
    build_tiny: bool = field(
        default=False,
        metadata={"help": "if model_name_or_path does not exist, build the tiny offline model into OUTPUT_DIR/base"},
    )
    tiny_seed: int = field(default=0, metadata={"help": "seed of the tiny model's weights (build_tiny only)"})
    kinds: str = field(
        default="decision,need_parse",
        metadata={"help": "comma-separated row kinds to train on: decision (planner actions), need_parse"},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "cap on train rows (smoke runs)"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "cap on eval rows"})
    merge: bool = field(default=True, metadata={"help": "write OUTPUT_DIR/merged (standalone checkpoint)"})
    model_class: str = field(
        default="causal_lm",
        metadata={"help": "causal_lm (AutoModelForCausalLM) or qwen3_omni_thinker (the Omni thinker, text only)"},
    )
    lora_exclude_modules: str | None = field(
        default=None,
        metadata={
            "help": "regex (PEFT exclude_modules, matched against full module names) of modules LoRA must not touch "
            "even when their names are in lora_target_modules, e.g. the Omni thinker's audio / vision towers"
        },
    )
    segment_cache: bool = field(
        default=True,
        metadata={
            "help": "while TRL tokenizes the dataset, encode each chat turn once and reuse it (sft/segment_cache.py: "
            "the same tokens, checked; ~3x faster preparation of planner rows); false = TRL's own encoding only"
        },
    )
    chat_template_kwargs: str | None = field(
        default=None,
        metadata={
            "help": 'JSON object passed to the chat template for every row, e.g. {"enable_thinking": false} for '
            "Qwen3 / Qwen3.5: the prompt then ends with the empty think block and the completion is the call alone"
        },
    )


def configure_device(training_args: SFTConfig, model_args: ModelConfig) -> torch.dtype:
    """bf16 on GPU; fp32 and use_cpu on a CPU-only machine (bf16 matmuls on CPU are slow and tested nowhere)."""
    if torch.cuda.is_available() and not training_args.use_cpu:
        training_args.bf16 = True if training_args.bf16 is None else training_args.bf16
        return getattr(torch, model_args.dtype) if model_args.dtype not in (None, "auto") else torch.bfloat16
    training_args.use_cpu = True
    training_args.bf16 = False
    training_args.fp16 = False
    compact_lm_head_on_cpu()  # same loss, about 2x faster steps on CPU (sft/lm_head.py)
    return torch.float32


def load_model(path: str, dtype: torch.dtype, model_args: ModelConfig, script_args: SFTScriptArguments):
    """The causal LM to train; the Qwen3-Omni recipe trains the text thinker of the Omni model."""
    kwargs = {"dtype": dtype, "attn_implementation": model_args.attn_implementation}
    kwargs["revision"] = model_args.model_revision
    if script_args.model_class == "causal_lm":
        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if script_args.model_class == "qwen3_omni_thinker":
        from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

        return Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(path, **kwargs)
    raise ValueError(f"model_class must be causal_lm or qwen3_omni_thinker, got {script_args.model_class!r}")


def load_sft_dataset(script_args: SFTScriptArguments) -> DatasetDict:
    """The harvested rows reduced to TRL's prompt-completion columns (+ tools), filtered by kind.

    Messages are JSON-typed in Arrow (collect.harvest.message_features) so each tool call keeps exactly its own
    argument keys as a mapping; rows of an older harvest (arguments as JSON strings) are converted here, before TRL
    applies the chat template (Qwen3.5's template iterates `arguments|items` and fails on a string)."""
    from datasets import Dataset, Features, Value

    if not Path(script_args.dataset_dir).exists():
        raise FileNotFoundError(f"dataset_dir {script_args.dataset_dir!r} does not exist: run collect.harvest first")
    ds = load_from_disk(script_args.dataset_dir)
    kinds = {k.strip() for k in script_args.kinds.split(",") if k.strip()}
    out, digests, task_ids = {}, {}, []
    for split, cap in (("train", script_args.max_train_samples), ("eval", script_args.max_eval_samples)):
        if split not in ds or len(ds[split]) == 0:
            continue
        d = ds[split].filter(lambda r: r["kind"] in kinds)
        if cap is not None:
            d = d.select(range(min(cap, len(d))))
        rows = [
            {"prompt": template_messages(r["prompt"]), "completion": template_messages(r["completion"]), "tools": t}
            for r in d.select_columns(SFT_COLUMNS)
            for t in [r["tools"]]
        ]
        features = {"prompt": message_features(), "completion": message_features(), "tools": Value("string")}
        if script_args.chat_template_kwargs:
            kwargs = json.loads(script_args.chat_template_kwargs)
            if not isinstance(kwargs, dict):
                raise ValueError(f"chat_template_kwargs must be a JSON object, got {kwargs!r}")
            rows = [{**r, "chat_template_kwargs": kwargs} for r in rows]  # TRL reads it per row
            features["chat_template_kwargs"] = message_features().feature
        out[split] = Dataset.from_list(rows, features=Features(features))
        digests[split] = rows_sha256(rows)
        if split == "train" and "task_id" in d.column_names:
            task_ids = sorted(set(d["task_id"]))
    if not out.get("train") or len(out["train"]) == 0:
        raise ValueError(f"{script_args.dataset_dir}: no train rows of kinds {sorted(kinds)}")
    result = DatasetDict(out)
    result.rows_sha256 = digests  # what the trainer reads, for train_summary.json's "inputs"
    result.task_ids = task_ids  # the tasks its train rows come from, for train_summary.json (pipeline.eval checks)
    return result


def rows_sha256(rows: list[dict]) -> str:
    """sha256 of rows as canonical JSON (sorted keys): the same rows give the same digest on any host."""
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def file_sha256(path: str | Path) -> str | None:
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    info = Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


HASHED_WEIGHTS_MAX_BYTES = 256 << 20  # a real checkpoint's weights are not read twice just to hash them


def run_fingerprints(model_path: str | Path, dataset: DatasetDict) -> dict:
    """Digests of what a run starts from and where it ran, so two hosts' runs can be compared input by input:
    the training rows, the base's tokenizer and (for a small base such as the tiny one) its weights, the CPU and
    torch's kernels. A run that differs with equal digests differs in the arithmetic, not in its inputs."""
    p = Path(model_path)
    weights = sorted(p.glob("*.safetensors"))
    small = weights and sum(w.stat().st_size for w in weights) <= HASHED_WEIGHTS_MAX_BYTES
    rows = getattr(dataset, "rows_sha256", {})
    return {
        "inputs": {
            "train_rows_sha256": rows.get("train"),
            "eval_rows_sha256": rows.get("eval"),
            "tokenizer_sha256": file_sha256(p / "tokenizer.json"),
            "base_weights_sha256": {w.name: file_sha256(w) for w in weights} if small else None,
        },
        "host": {
            "cpu": cpu_name(),
            "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(),
        },
    }


ADAPTER_PREFIX = "base_model.model."
WEIGHT_INDEX = "model.safetensors.index.json"


def checkpoint_keys(path: str | Path) -> dict[str, str]:
    """Tensor name -> safetensors file name of a save_pretrained directory."""
    from safetensors import safe_open

    p = Path(path)
    if (p / WEIGHT_INDEX).exists():
        return json.loads((p / WEIGHT_INDEX).read_text())["weight_map"]
    keys = {}
    for f in sorted(p.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            keys.update(dict.fromkeys(h.keys(), f.name))
    if not keys:
        raise FileNotFoundError(f"{p}: no safetensors weights")
    return keys


def adapter_modules(adapter_dir: str | Path) -> list[str]:
    """Module names (as PEFT saved them, without `base_model.model.`) that carry LoRA weights."""
    from safetensors import safe_open

    with safe_open(str(Path(adapter_dir) / "adapter_model.safetensors"), "pt") as h:
        return sorted({k[len(ADAPTER_PREFIX) :].partition(".lora_")[0] for k in h.keys()})


def checkpoint_module_names(model, modules: list[str]) -> dict[str, str]:
    """Training (in-memory) module name -> the name the model's checkpoint stores it under.

    transformers 5 renames keys when it loads some checkpoints (Qwen3.5's `model.language_model.*` becomes
    `model.*` in Qwen3_5ForCausalLM; the Omni thinker's `model.*` becomes `model.language_model.*`) and reverts the
    renaming in save_pretrained. PEFT saves adapters under the in-memory names, which then match neither the
    checkpoint nor vLLM (which maps checkpoint names with its hf_to_vllm_mapper), and a mismatched adapter is skipped
    with only a warning. This asks transformers' own revert for each module's weight name."""
    from transformers.core_model_loading import revert_weight_conversion

    out = {}
    for name in modules:
        (key,) = revert_weight_conversion(model, {f"{name}.weight": model.get_submodule(name).weight})
        if not key.endswith(".weight"):
            raise ValueError(f"{name}: its weight is saved as {key!r}, not a single renamed tensor")
        out[name] = key[: -len(".weight")]
    return out


def write_serving_adapter(adapter_dir: str | Path, out_dir: str | Path, names: dict[str, str]) -> Path:
    """The adapter with every module renamed to the checkpoint's names (same tensors, same adapter_config)."""
    from safetensors.torch import load_file, save_file

    src, out = Path(adapter_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    renamed = {}
    for k, v in load_file(str(src / "adapter_model.safetensors")).items():
        module, _, rest = k[len(ADAPTER_PREFIX) :].partition(".lora_")
        renamed[f"{ADAPTER_PREFIX}{names.get(module, module)}.lora_{rest}"] = v.contiguous()
    save_file(renamed, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.copy(src / "adapter_config.json", out / "adapter_config.json")
    return out


def to_base_layout(model_dir: str | Path, base_path: str | Path) -> dict:
    """Rewrite a saved checkpoint (the merged / fully fine-tuned training model) into the base checkpoint's layout.

    Training loads only the text model (Qwen3_5ForCausalLM out of the Qwen3.5 vision-language checkpoint, the Omni
    thinker out of Qwen3-Omni), whose own save writes another architecture and config and drops the towers. vLLM
    serves the original architecture with its `hf_to_vllm_mapper` (e.g. `model.language_model.` ->
    `language_model.model.` for Qwen3.5); a text-only Qwen3_5ForCausalLM with `model.language_model.*` keys would
    load none of them (vLLM's Qwen3_5Model skips unknown names with a warning). So: every trained tensor replaces
    the base tensor of the same name (with a common prefix such as `thinker.` added when the base has one), every
    other base tensor (vision/audio towers, talker) is copied, the shard files and config are the base's. A trained
    tensor with no counterpart in the base is an error. Returns what was done (for the summary)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out, base = Path(model_dir), Path(base_path)
    trained, base_keys = checkpoint_keys(out), checkpoint_keys(base)
    if set(trained) == set(base_keys):
        return {"rewritten": False, "prefix": ""}
    k0 = next(iter(trained))
    prefixes = sorted({b[: -len(k0)] for b in base_keys if b.endswith(k0)}, key=len)
    prefix = next((p for p in prefixes if all(p + k in base_keys for k in trained)), None)
    if prefix is None:
        missing = sorted(k for k in trained if k not in base_keys)[:5]
        raise ValueError(f"{out}: trained tensors {missing} have no counterpart in the base checkpoint {base}")
    trained_files = {}
    for k, f in trained.items():
        trained_files.setdefault(f, []).append(k)
    tensors = {}
    for f, ks in trained_files.items():
        with safe_open(str(out / f), "pt") as h:
            tensors.update({prefix + k: h.get_tensor(k) for k in ks})
    for f in {*trained.values()}:
        (out / f).unlink()
    (out / WEIGHT_INDEX).unlink(missing_ok=True)
    shards: dict[str, list[str]] = {}
    for k, f in base_keys.items():
        shards.setdefault(f, []).append(k)
    for f, ks in sorted(shards.items()):
        with safe_open(str(base / f), "pt") as h:
            part = {k: (tensors[k] if k in tensors else h.get_tensor(k)).contiguous() for k in ks}
        save_file(part, str(out / f), metadata={"format": "pt"})
    if (base / WEIGHT_INDEX).exists():
        shutil.copy(base / WEIGHT_INDEX, out / WEIGHT_INDEX)
    # the base's config (its architecture, the towers' configs) and processor files; the tokenizer stays ours
    for f in base.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != WEIGHT_INDEX:
            if f.name in ("config.json", "generation_config.json") or not (out / f.name).exists():
                shutil.copy(f, out / f.name)
    return {"rewritten": True, "prefix": prefix, "trained_tensors": len(tensors), "base_tensors": len(base_keys)}


def export_adapter(base_path: str, adapter_dir: str, out_dir: str, dtype: torch.dtype, script_args) -> dict:
    """OUT/vllm_adapter (checkpoint module names) and, when `out_dir` is set, OUT/merged in the base's layout.

    The base is reloaded on CPU and the adapter applied from disk (not the in-memory model), which also works after
    DeepSpeed ZeRO-3, where the live parameters are sharded across ranks."""
    from peft import PeftModel

    base = load_model(base_path, dtype, ModelConfig(), script_args)
    names = checkpoint_module_names(base, adapter_modules(adapter_dir))
    write_serving_adapter(adapter_dir, Path(adapter_dir) / "vllm_adapter", names)
    renamed = any(k != v for k, v in names.items())
    result = {"vllm_adapter": str(Path(adapter_dir) / "vllm_adapter"), "renamed_modules": renamed}
    if out_dir:
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        merged.save_pretrained(out_dir)
        AutoTokenizer.from_pretrained(adapter_dir).save_pretrained(out_dir)
        result["merged_layout"] = to_base_layout(out_dir, base_path)
    return result


def lora_module_names(model) -> list[str]:
    """Modules of the (PEFT-wrapped) training model that carry a LoRA adapter, without PEFT's prefix."""
    names = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and len(getattr(m, "lora_A", {}))]
    return sorted(n[len(ADAPTER_PREFIX) :] if n.startswith(ADAPTER_PREFIX) else n for n in names)


def peft_config(model_args: ModelConfig, script_args: SFTScriptArguments):
    """TRL's LoraConfig from the recipe, plus `exclude_modules`. Why exclusion and not a target regex: for MoE models
    (the Omni thinker), PEFT 0.21 resolves a regex target_modules into bare module names before matching
    (peft.utils.transformers_weight_conversion._convert_peft_config_moe), so a regex naming only the text layers still
    lands on the audio tower's q/k/v; exclude_modules is applied as given."""
    config = get_peft_config(model_args)
    if config is not None and script_args.lora_exclude_modules:
        config.exclude_modules = script_args.lora_exclude_modules
    return config


def build_trainer(script_args: SFTScriptArguments, training_args: SFTConfig, model_args: ModelConfig):
    """Steps 2-4: device setup, base model (tiny build if asked), dataset, SFTTrainer. Returns (trainer, dataset)."""
    out = Path(training_args.output_dir)
    dtype = configure_device(training_args, model_args)

    if not Path(script_args.dataset_dir).exists():  # before a base model is built or loaded
        raise FileNotFoundError(f"dataset_dir {script_args.dataset_dir!r} does not exist: run collect (harvest) first")
    # -- the base model (build the tiny one offline when asked and absent)
    model_path = model_args.model_name_or_path
    if model_path is None or not Path(model_path).exists():
        if not script_args.build_tiny:
            raise FileNotFoundError(f"model_name_or_path {model_path!r} does not exist and build_tiny is false")
        model_path = str(out / "base")
        if not (Path(model_path) / "config.json").exists():
            build_tiny_model(model_path, seed=script_args.tiny_seed)
        model_args.model_name_or_path = model_path

    # -- data and model
    dataset = load_sft_dataset(script_args)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = load_model(model_path, dtype, model_args, script_args)
    if script_args.model_class == "qwen3_omni_thinker":
        expose_thinker_backbone(model)  # transformers 5.17: the backbone TRL's fused LM head calls (sft/lm_head.py)
    if "eval" not in dataset:
        training_args.eval_strategy = "no"

    t0 = time.time()
    with segment_cached(tokenizer, enabled=script_args.segment_cache) as cache:  # TRL tokenizes the rows in here
        trainer = SFTTrainer(
            model=model,
            args=training_args,
            train_dataset=dataset["train"],
            eval_dataset=dataset.get("eval") if training_args.eval_strategy != "no" else None,
            processing_class=tokenizer,
            peft_config=peft_config(model_args, script_args),  # None unless use_peft
        )
    trainer.prepare_s = round(time.time() - t0, 2)  # dataset preparation (+ model wrapping), for the summary
    # what the cache did in this process (the workers of dataset_num_proc > 1 keep their own counts)
    trainer.segment_cache_stats = None if cache is None else {**cache.stats, "enabled": cache._enabled}
    if cache is not None:
        logger.info("segment cache: %s", trainer.segment_cache_stats)
    return trainer, dataset


def main(script_args: SFTScriptArguments, training_args: SFTConfig, model_args: ModelConfig) -> dict:
    trainer, dataset = build_trainer(script_args, training_args, model_args)
    out = Path(training_args.output_dir)
    model_path = model_args.model_name_or_path
    dtype = torch.bfloat16 if training_args.bf16 else torch.float32  # merge in the training dtype

    # -- train
    lora_modules = lora_module_names(trainer.model) if model_args.use_peft else []
    t0 = time.time()
    result = trainer.train()
    train_time = time.time() - t0
    metrics = final_eval_metrics(trainer) if "eval" in dataset and training_args.eval_strategy != "no" else {}

    # -- save: adapter (LoRA) or full model; then the standalone merged checkpoint, both in the base's layout
    merged_dir = out / "merged"
    export: dict = {}
    if model_args.use_peft:
        trainer.save_model(str(out))  # adapter_model.safetensors + adapter_config.json + tokenizer
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            export = export_adapter(
                model_path, str(out), str(merged_dir) if script_args.merge else "", dtype, script_args
            )
    else:
        trainer.save_model(str(merged_dir))
        trainer.accelerator.wait_for_everyone()
        if trainer.accelerator.is_main_process:
            export = {"merged_layout": to_base_layout(merged_dir, model_path)}
    trainer.accelerator.wait_for_everyone()

    # -- summary
    losses = [{"step": h["step"], "loss": h["loss"]} for h in trainer.state.log_history if "loss" in h]
    summary = {
        "model": model_path,
        "use_peft": bool(model_args.use_peft),
        "lora_target_modules": model_args.lora_target_modules if model_args.use_peft else None,
        "lora_modules": lora_modules,  # where LoRA landed (training module names)
        "dataset_dir": script_args.dataset_dir,
        "train_rows": len(dataset["train"]),
        # the tasks the train rows come from: pipeline.eval warns when a planner is scored on one of them
        "trained_task_ids": getattr(dataset, "task_ids", []),
        "eval_rows": len(dataset["eval"]) if "eval" in dataset else 0,
        "steps": trainer.state.global_step,
        "train_time_s": round(train_time, 2),
        "prepare_s": getattr(trainer, "prepare_s", None),  # SFTTrainer construction: tokenizing the rows
        "segment_cache": getattr(trainer, "segment_cache_stats", None),
        # tokens the trainer consumed (TRL logs a running num_tokens), for throughput figures
        "num_tokens": next(
            (int(float(h["num_tokens"])) for h in reversed(trainer.state.log_history) if "num_tokens" in h), None
        ),
        "train_loss": result.training_loss,
        "first_loss": losses[0]["loss"] if losses else None,
        "last_loss": losses[-1]["loss"] if losses else None,
        "losses": losses,
        "eval": metrics,
        # eval passes logged during the run (periodic ones included); the final one is never repeated, so a
        # 1-step run has exactly 1
        "eval_passes": sum(1 for h in trainer.state.log_history if "eval_loss" in h),
        "export": export,
        "device": "cuda" if torch.cuda.is_available() and not training_args.use_cpu else "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "merged": str(merged_dir) if (script_args.merge or not model_args.use_peft) else None,
        "script_args": asdict(script_args),
        **run_fingerprints(model_path, dataset),  # "inputs" and "host"
    }
    if trainer.accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        jsonio.write_json(out / "train_summary.json", summary, default=str)  # a NaN loss is written as "NaN"
        loss = (
            f"loss {summary['first_loss']} -> {summary['last_loss']}"
            if losses
            else f"mean loss {summary['train_loss']:.4f} (no step logged: max_steps < logging_steps)"
        )
        print(f"sft: {summary['steps']} steps in {train_time:.1f}s, {loss}; merged -> {summary['merged']}")
    return summary


def final_eval_metrics(trainer) -> dict:
    """Metrics of the final model on the eval split, computed once.

    With eval_strategy steps/epoch the Trainer already evaluates after the last step (transformers'
    DefaultFlowCallback sets should_evaluate at the final step); calling trainer.evaluate() again would run the same
    pass twice. Its logged metrics are reused when they are for the final step; otherwise (no eval logged at the end)
    one pass is run here."""
    last = next((h for h in reversed(trainer.state.log_history) if "eval_loss" in h), None)
    if last is not None and last.get("step") == trainer.state.global_step:
        return {k: v for k, v in last.items() if k.startswith("eval_") or k == "epoch"}
    return trainer.evaluate()


def parse_args(argv: list[str] | None = None) -> tuple[SFTScriptArguments, SFTConfig, ModelConfig]:
    """YAML recipe (--config) + CLI overrides. Without CUDA the defaults become use_cpu/fp32 before SFTConfig
    validates itself (it rejects bf16 on a CPU-only machine); a recipe that sets bf16: true still fails there."""
    parser = TrlParser((SFTScriptArguments, SFTConfig, ModelConfig))
    if not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True, bf16=False)
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    run_cli(
        lambda: main(*parse_args()),
        "training stopped; OUT holds no final model (rerun to train again)",
        errors=(FileNotFoundError,),
    )
