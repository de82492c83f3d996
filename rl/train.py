"""Closure-aligned RL (paper v3 §3.4, Appendix F.3): decision-level GRPO over recorded ledger states, no rollouts.

For each rl_states row the policy samples G candidate decisions for the same prompt; nothing is executed. Each
candidate is scored by rewards.REWARD_FUNCS (valid, gate: ledger rules; target, align: one judge call), TRL
normalises within the group and applies the clipped GRPO objective with a KL penalty to the post-SFT policy.

    python -m rl.train --config configs/rl/tiny.yaml [--dataset_dir DATA/rl_states] [--model_name_or_path MODEL]
                       [--output_dir OUT]

The KL reference is the post-SFT policy, never the raw base:
  * full weights at model_name_or_path (a full-FT or merged SFT checkpoint), no ``lora``: TRL loads the reference
    from the same path, i.e. the SFT checkpoint;
  * full weights + a ``lora`` block: a fresh adapter on the SFT weights; TRL's reference is the model with the adapter
    disabled = the SFT weights;
  * a LoRA adapter directory (adapter_config.json): loaded as a trainable PeftModel; TRL copies the SFT adapter into a
    frozen "ref" adapter (stack.md), which is removed before saving.
Prompts are pre-rendered with the policy tokenizer's chat template INCLUDING each row's tools (a static dataset cannot
feed a per-row tools column to TRL's own rendering). Writes OUT (model + tokenizer) and OUT/rl_summary.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("rl.train")


@dataclass
class RLConfig:
    """One RL recipe (configs/rl/*.yaml). Values not set here keep TRL's defaults."""

    model_name_or_path: str = field(
        default="", metadata={"help": "post-SFT policy: full/merged weights or an adapter"}
    )
    dataset_dir: str = field(default="", metadata={"help": "rl_states DatasetDict (save_to_disk) with a train split"})
    output_dir: str = field(default="runs/rl", metadata={"help": "final model + tokenizer + rl_summary.json"})
    train_split: str = field(default="train", metadata={"help": "split to train on"})
    max_train_samples: int | None = field(default=None, metadata={"help": "cap the number of states (demo/debug)"})
    # GRPO (paper F.3)
    num_generations: int = field(default=8, metadata={"help": "G: candidate decisions per state"})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "completions per device per step"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    learning_rate: float = field(default=5e-6, metadata={"help": "peak learning rate"})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "paper: cosine decay"})
    warmup_steps: float = field(default=0, metadata={"help": "warmup steps (int) or share of steps (float < 1)"})
    num_train_epochs: float = field(default=5, metadata={"help": "epochs over the state pool"})
    max_steps: int = field(default=-1, metadata={"help": ">0 overrides num_train_epochs"})
    beta: float = field(default=0.01, metadata={"help": "KL coefficient to the post-SFT reference"})
    epsilon: float = field(default=0.2, metadata={"help": "PPO-style clip range"})
    loss_type: str = field(default="grpo", metadata={"help": "paper objective (TRL default is dapo)"})
    scale_rewards: str = field(default="group", metadata={"help": "group std normalisation (paper eq. 2)"})
    max_completion_length: int = field(default=256, metadata={"help": "tokens per sampled decision"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature for the G candidates"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling"})
    reward_weights: dict = field(
        default_factory=lambda: {"valid": 0.1, "gate": 0.1, "target": 0.2, "align": 0.6},
        metadata={"help": "alpha_1..4 of eq. 1, by reward name"},
    )
    judge: dict = field(default_factory=lambda: {"kind": "offline"}, metadata={"help": "rewards.judge.JudgeConfig"})
    chat_template_kwargs: dict = field(default_factory=dict, metadata={"help": "e.g. {enable_thinking: false}"})
    lora: dict | None = field(default=None, metadata={"help": "peft.LoraConfig kwargs for a new adapter, or null"})
    # runtime
    use_vllm: bool = field(default=False, metadata={"help": "generate with vLLM (GPU nodes only)"})
    vllm_mode: str = field(default="colocate", metadata={"help": "colocate | server"})
    vllm_kwargs: dict = field(default_factory=dict, metadata={"help": "extra GRPOConfig vllm_* fields"})
    bf16: bool = field(default=False, metadata={"help": "bf16 weights/compute (GPU)"})
    use_cpu: bool = field(default=False, metadata={"help": "force CPU"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for memory"})
    logging_steps: int = field(default=1, metadata={"help": "log every N steps"})
    save_strategy: str = field(default="no", metadata={"help": "intermediate checkpoints"})
    save_steps: int = field(default=500, metadata={"help": "checkpoint interval when save_strategy=steps"})
    seed: int = field(default=0, metadata={"help": "sampling and init seed"})
    report_to: str = field(default="none", metadata={"help": "none | tensorboard | wandb"})
    log_completions: bool = field(default=False, metadata={"help": "TRL completions table"})
    dtype: str = field(default="auto", metadata={"help": "model load dtype: auto | float32 | bfloat16"})


def load_config(path: str | None, overrides: dict[str, Any]) -> RLConfig:
    """YAML recipe + CLI overrides; unknown keys are an error that names the file."""
    data = yaml.safe_load(Path(path).read_text()) if path else {}
    data = data or {}
    known = {f.name for f in fields(RLConfig)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path}: unknown RL config key(s) {sorted(unknown)}")
    data.update({k: v for k, v in overrides.items() if v is not None})
    cfg = RLConfig(**data)
    for name in ("model_name_or_path", "dataset_dir"):
        if not getattr(cfg, name):
            raise ValueError(f"{path}: {name} is required (set it in the recipe or pass --{name})")
    return cfg


def is_adapter_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def load_policy(cfg: RLConfig):
    """(model, tokenizer, peft_config, how) for the post-SFT policy; see the module docstring for the three cases."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    path = cfg.model_name_or_path
    if is_adapter_dir(path):
        from peft import PeftConfig, PeftModel

        if cfg.lora:
            raise ValueError(f"{path} is already a LoRA adapter; remove the recipe's lora block (TRL refuses both)")
        base = PeftConfig.from_pretrained(path).base_model_name_or_path
        tok_src = path if (Path(path) / "tokenizer_config.json").exists() else base
        tok = AutoTokenizer.from_pretrained(tok_src)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        model = PeftModel.from_pretrained(model, path, is_trainable=True)
        return model, tok, None, "sft_adapter_copied_to_ref_adapter"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if cfg.lora:
        from peft import LoraConfig

        return model, tok, LoraConfig(task_type="CAUSAL_LM", **cfg.lora), "new_adapter_ref_is_sft_weights"
    return model, tok, None, "full_ft_ref_loaded_from_sft_checkpoint"


def render_prompts(ds, tok, chat_template_kwargs: dict):
    """Replace each row's message list by the policy's chat-template text with that row's tools in the header."""

    def one(row):
        tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
        text = tok.apply_chat_template(
            row["prompt"], tools=tools or None, add_generation_prompt=True, tokenize=False, **chat_template_kwargs
        )
        return {"prompt": text}

    return ds.map(one, desc="render prompts")


def summarize(trainer, wall_s: float, cfg: RLConfig, how: str, judge_stats: dict, n_states: int) -> dict:
    """Steps, wall time and per-component reward means (first/last/mean over logged steps)."""
    from rewards import REWARD_FUNCS

    hist = [h for h in trainer.state.log_history if "reward" in h]
    keys = ["reward"] + [f"rewards/{k}/mean" for k in REWARD_FUNCS] + ["kl", "frac_reward_zero_std", "loss"]
    comp = {}
    for k in keys:
        vals = [h[k] for h in hist if k in h and h[k] == h[k]]  # drop NaN
        if vals:
            comp[k] = {"mean": sum(vals) / len(vals), "first": vals[0], "last": vals[-1]}
    steps = trainer.state.global_step
    return {
        "steps": steps,
        "wall_time_s": round(wall_s, 2),
        "s_per_step": round(wall_s / max(1, steps), 3),
        "n_states": n_states,
        "num_generations": cfg.num_generations,
        "reference_policy": how,
        "reward_weights": cfg.reward_weights,
        "metrics": comp,
        "judge": judge_stats,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="closure-aligned decision-level GRPO (no rollouts)")
    ap.add_argument("--config", required=True, help="RL recipe YAML (configs/rl/*.yaml)")
    ap.add_argument("--dataset_dir", help="rl_states DatasetDict (overrides the recipe)")
    ap.add_argument("--model_name_or_path", help="post-SFT policy (overrides the recipe)")
    ap.add_argument("--output_dir", help="output directory (overrides the recipe)")
    ap.add_argument("--max_steps", type=int, help="override max_steps (smoke runs)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = load_config(
        a.config,
        {
            "dataset_dir": a.dataset_dir,
            "model_name_or_path": a.model_name_or_path,
            "output_dir": a.output_dir,
            "max_steps": a.max_steps,
        },
    )
    _, summary = train(cfg)
    return summary


def train(cfg: RLConfig):
    """Run GRPO for one recipe; returns (trainer, summary). Writes OUT/ and OUT/rl_summary.json."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # 1. data: the recorded state pool; prompts rendered with each row's tools
    from datasets import load_from_disk

    dd = load_from_disk(cfg.dataset_dir)
    if cfg.train_split not in dd:
        raise ValueError(f"{cfg.dataset_dir}: no split {cfg.train_split!r} (has {list(dd)})")
    ds = dd[cfg.train_split]
    if cfg.max_train_samples:
        ds = ds.select(range(min(cfg.max_train_samples, len(ds))))
    model, tok, peft_config, how = load_policy(cfg)
    ds = render_prompts(ds, tok, cfg.chat_template_kwargs)
    log.info("%d states from %s; policy %s (%s)", len(ds), cfg.dataset_dir, cfg.model_name_or_path, how)

    # 2. rewards: valid, gate (rules) + target, align (one judge call each candidate)
    from rewards import REWARD_FUNCS, build_judge, use_judge, weights_list

    judge = use_judge(build_judge(cfg.judge))

    # 3. GRPO with the paper's objective
    from trl import GRPOConfig, GRPOTrainer

    from sft.lm_head import compact_lm_head_on_cpu

    compact_lm_head_on_cpu()  # CPU only: the policy's log-probs over completion tokens only (same loss, faster)
    args = GRPOConfig(
        output_dir=cfg.output_dir,
        num_generations=cfg.num_generations,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type=cfg.lr_scheduler_type,
        warmup_steps=cfg.warmup_steps,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        beta=cfg.beta,
        epsilon=cfg.epsilon,
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        reward_weights=weights_list(cfg.reward_weights),
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        **cfg.vllm_kwargs,
        bf16=cfg.bf16,
        use_cpu=cfg.use_cpu,
        gradient_checkpointing=cfg.gradient_checkpointing,
        logging_steps=cfg.logging_steps,
        save_strategy=cfg.save_strategy,
        save_steps=cfg.save_steps,
        seed=cfg.seed,
        report_to=cfg.report_to,
        log_completions=cfg.log_completions,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=list(REWARD_FUNCS.values()),
        args=args,
        train_dataset=ds,
        processing_class=tok,
        peft_config=peft_config,
    )
    if cfg.beta and how == "full_ft_ref_loaded_from_sft_checkpoint":
        ref_src = getattr(trainer.ref_model.config, "_name_or_path", None) if trainer.ref_model is not None else None
        if ref_src is None or Path(ref_src).resolve() != Path(cfg.model_name_or_path).resolve():
            raise RuntimeError(f"KL reference {ref_src!r} is not the SFT checkpoint {cfg.model_name_or_path!r}")

    t0 = time.time()
    trainer.train()
    wall = time.time() - t0

    # 4. outputs: final policy (+ tokenizer) and the run summary
    out = Path(cfg.output_dir)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(unwrapped, "peft_config") and "ref" in unwrapped.peft_config:
        # the frozen reference copy of the SFT adapter is not part of the trained policy: save "default" only
        if trainer.accelerator.is_main_process:
            unwrapped.save_pretrained(str(out), selected_adapters=["default"])
    else:
        trainer.save_model(str(out))
    tok.save_pretrained(str(out))
    summary = summarize(trainer, wall, cfg, how, dict(judge.stats), len(ds))
    summary["config"] = asdict(cfg)
    if trainer.accelerator.is_main_process:
        (out / "rl_summary.json").write_text(json.dumps(summary, indent=1))
        m = summary["metrics"]
        log.info(
            "done: %d steps in %.1fs (%.2f s/step); reward means %s",
            summary["steps"],
            wall,
            summary["s_per_step"],
            {k: round(v["mean"], 3) for k, v in m.items() if k.startswith("reward")},
        )
    return trainer, summary


if __name__ == "__main__":
    main()
