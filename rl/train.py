"""Closure-aligned RL (paper v3 §3.4, Appendix F.3): decision-level GRPO over recorded ledger states, no rollouts.

For each rl_states row the policy samples G candidate decisions for the same prompt; no tool is called. Each
candidate is scored by rewards.REWARD_FUNCS (valid, gate: ledger rules; target, align: one judge call; compute, only
when the recipe weighs it: the candidate program run in the sandbox against the reference program), TRL
normalises within the group and applies the clipped GRPO objective with a KL penalty to the post-SFT policy.

    python -m rl.train --config configs/rl/tiny.yaml [--dataset_dir DATA/rl_states] [--model_name_or_path MODEL]
                       [--output_dir OUT] [--learning_rate 1e-5] [--max_steps 4] [any other GRPOConfig field]

Recipes are parsed like the SFT ones: ``trl.TrlParser`` reads the YAML into (RLScriptArguments, trl.GRPOConfig,
trl.ModelConfig), so every TRL option is a recipe key and a command-line override. ``reward_weights`` may be TRL's
list (REWARD_FUNCS order) or a mapping by reward name; LoRA is ModelConfig's ``use_peft`` + ``lora_*``.

The KL reference is the post-SFT policy, never the raw base:
  * full weights at model_name_or_path (a full-FT or merged SFT checkpoint), ``use_peft: false``: TRL loads the
    reference from the same path, i.e. the SFT checkpoint, with the policy's own class (reference_built_like: TRL
    would otherwise pick the class named in config.architectures[0], e.g. a vision-language ConditionalGeneration
    class for a CausalLM policy);
  * full weights + ``use_peft: true``: a fresh adapter on the SFT weights; TRL's reference is the model with the
    adapter disabled = the SFT weights;
  * a LoRA adapter directory (adapter_config.json): loaded as a trainable PeftModel; TRL copies the SFT adapter into a
    frozen "ref" adapter (TRL 1.16 grpo_trainer.py, `model.add_adapter("ref", ...)`), which is removed before saving.
Prompts are pre-rendered with the policy tokenizer's chat template INCLUDING each row's tools (a static dataset cannot
feed a per-row tools column to TRL's own rendering). Writes OUT (model + tokenizer) and OUT/rl_summary.json.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

from collect import jsonio

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models are local paths

import torch
from datasets import concatenate_datasets, load_from_disk
from peft import PeftConfig, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config
from trl.trainer import grpo_trainer

from collect.cli import run_cli
from collect.harvest import template_messages
from rewards import (
    DEFAULT_WEIGHTS,
    PAPER_REWARDS,
    REWARD_FUNCS,
    ExecutionCheck,
    build_judge,
    get_execution_check,
    trainer_reward_funcs,
    use_execution_check,
    use_judge,
    weights_list,
)
from rewards.rules import load_json_column
from sft.lm_head import compact_lm_head_on_cpu

log = logging.getLogger("rl.train")


@dataclass
class RLScriptArguments:
    """Stage options that are neither GRPO hyper-parameters (GRPOConfig) nor model options (ModelConfig)."""

    dataset_dir: str = field(
        default="runs/collect/rl_states",
        metadata={"help": "rl_states DatasetDict(s) (save_to_disk) with a train split; several: comma-separated"},
    )
    train_split: str = field(default="train", metadata={"help": "split to train on"})
    origins: str | None = field(
        default=None, metadata={"help": "keep only states of these origins (comma-separated: teacher, onpolicy)"}
    )
    reference_tools: str | None = field(
        default=None,
        metadata={
            "help": "keep only states whose reference decision calls one of these tools (comma-separated, e.g. "
            "code_executor: GRPO on the program states, where the compute reward applies)"
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "cap the number of states (demo/debug)"})
    judge: dict | str | None = field(
        default_factory=lambda: {"kind": "offline"},
        metadata={"help": "rewards.judge.JudgeConfig fields (a YAML mapping, or JSON on the command line)"},
    )

    def __post_init__(self):
        if isinstance(self.judge, str):
            self.judge = json.loads(self.judge)
        self.judge = dict(self.judge or {})


class RLRecipe(NamedTuple):
    """One parsed RL recipe: the three dataclasses TrlParser fills."""

    script: RLScriptArguments
    training: GRPOConfig
    model: ModelConfig


def named_weights(weights) -> dict[str, float]:
    """reward_weights by reward name, from TRL's list (REWARD_FUNCS order; the paper's four alone leave `compute` at
    its default 0), a mapping, or None (paper defaults)."""

    if weights is None:
        return dict(DEFAULT_WEIGHTS)
    if isinstance(weights, dict):
        return dict(zip(REWARD_FUNCS, weights_list(weights), strict=True))
    if len(weights) not in (len(PAPER_REWARDS), len(REWARD_FUNCS)):
        raise ValueError(
            f"reward_weights: {len(weights)} values for {len(REWARD_FUNCS)} rewards {list(REWARD_FUNCS)} "
            f"(or the paper's {len(PAPER_REWARDS)}: {list(PAPER_REWARDS)})"
        )
    given = dict(zip(REWARD_FUNCS, map(float, weights), strict=False))  # the first len(weights) names, in order
    return dict(zip(REWARD_FUNCS, weights_list(given), strict=True))


def named_weights_flag(argv: list[str] | None, weights=named_weights) -> list[str] | None:
    """`--reward_weights '{"compute": 0.3, ...}'` (a JSON mapping by reward name, as a recipe's YAML mapping; what
    sft.onpolicy's rl_args and load_config pass for a mapping) becomes TRL's list of floats in the order `weights`
    gives (named_weights: REWARD_FUNCS order; rl.online: its own rewards)."""
    if not argv:
        return argv
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a in ("--reward_weights", "--reward-weights") and out[i + 1].lstrip().startswith("{"):
            try:
                mapping = json.loads(out[i + 1])
            except json.JSONDecodeError as e:
                raise ValueError(f"--reward_weights: not a JSON mapping: {e}: {out[i + 1]!r}") from None
            out[i + 1 : i + 2] = [str(w) for w in weights(mapping).values()]
            break
    return out


def parse_recipe(argv: list[str] | None, script_cls, weights=named_weights) -> RLRecipe:
    """YAML recipe (--config) + command-line overrides into (script_cls, GRPOConfig, ModelConfig). Unknown recipe
    keys are an error that names the file. `weights` turns reward_weights (TRL's list, a mapping by name, or None)
    into {name: weight} in the order of the trainer's reward functions.

    Without CUDA the defaults become use_cpu/fp32 before GRPOConfig validates itself (it rejects bf16 on a CPU-only
    machine), as in sft.train; a recipe that sets bf16: true still needs `--bf16 false` there."""

    argv = named_weights_flag(list(argv) if argv is not None else sys.argv[1:], weights)
    parser = TrlParser((script_cls, GRPOConfig, ModelConfig))
    if not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True, bf16=False)
    path = argv[argv.index("--config") + 1] if argv and "--config" in argv else None
    try:
        script, training, model = parser.parse_args_and_config(args=argv)
    except ValueError as e:
        raise ValueError(f"{path}: {e}" if path else str(e)) from None
    # TRL wants a list in the reward functions' order; recipes may name the weights (validated either way)
    training.reward_weights = list(weights(training.reward_weights).values())
    return RLRecipe(script, training, model)


def parse_args(argv: list[str] | None = None) -> RLRecipe:
    """An rl.train recipe (parse_recipe with RLScriptArguments and the REWARD_FUNCS weights)."""
    return parse_recipe(argv, RLScriptArguments)


def recipe_argv(path: str | None, overrides: dict[str, Any] | None = None) -> list[str]:
    """The command line of a recipe path plus a few overrides ({field: value}, None = not given)."""
    argv = ["--config", str(path)] if path else []
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if isinstance(v, list | tuple):
            argv += [f"--{k}", *map(str, v)]
        else:
            argv += [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return argv


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> RLRecipe:
    """parse_args for callers holding a recipe path and a few overrides ({field: value}, None = not given)."""
    return parse_args(recipe_argv(path, overrides))


def is_adapter_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def reference_policy(model_args: ModelConfig) -> str:
    """Which of the three policy / KL-reference cases of the module docstring a recipe's model options make."""
    if is_adapter_dir(model_args.model_name_or_path or ""):
        return "sft_adapter_copied_to_ref_adapter"
    return "new_adapter_ref_is_sft_weights" if model_args.use_peft else "full_ft_ref_loaded_from_sft_checkpoint"


def load_policy(model_args: ModelConfig):
    """(model, tokenizer, peft_config, how) for the post-SFT policy; see the module docstring for the three cases."""

    path = model_args.model_name_or_path
    if not path:
        raise ValueError("model_name_or_path is required (set it in the recipe or pass --model_name_or_path)")
    dtype = model_args.dtype
    kwargs = {
        "dtype": dtype if dtype in (None, "auto") else getattr(torch, dtype),
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
    }
    if is_adapter_dir(path):
        if model_args.use_peft:
            raise ValueError(f"{path} is already a LoRA adapter; set use_peft: false (TRL refuses both)")
        base = PeftConfig.from_pretrained(path).base_model_name_or_path
        tok_src = path if (Path(path) / "tokenizer_config.json").exists() else base
        tok = AutoTokenizer.from_pretrained(tok_src)
        model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
        model = PeftModel.from_pretrained(model, path, is_trainable=True)
        return model, tok, None, reference_policy(model_args)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if model_args.use_peft:
        return model, tok, get_peft_config(model_args), reference_policy(model_args)
    return model, tok, None, reference_policy(model_args)


def render_prompt(tok, messages: list[dict], tools: list[dict] | None, chat_template_kwargs: dict | None = None):
    """The chat-template text of one planner state: its messages (through collect.harvest.template_messages, as
    state-SFT's rows are) with its tools in the header, up to the assistant turn. GRPO's prompt of a recorded state
    (render_prompts) and of a state the online trainer reaches (rl.online) are this text; its ids are
    `tok(text, add_special_tokens=False)`, the ids state-SFT put before the first label (tests/test_templates.py)."""
    kwargs = dict(chat_template_kwargs or {})
    return tok.apply_chat_template(
        template_messages(messages), tools=tools or None, add_generation_prompt=True, tokenize=False, **kwargs
    )


def render_prompts(ds, tok, chat_template_kwargs: dict | None):
    """Replace each row's message list by the policy's chat-template text with that row's tools in the header.

    The messages go through collect.harvest.template_messages first, as state-SFT's rows do, so a prompt that replays
    an earlier tool call in the OpenAI wire form renders for GRPO exactly as SFT trained on it (and as vLLM serves it);
    Qwen3.5's template rejects the wire form's string arguments."""

    def one(row):
        tools = load_json_column(row["tools"], "tools")
        return {"prompt": render_prompt(tok, row["prompt"], tools, chat_template_kwargs)}

    return ds.map(one, desc="render prompts")


SCORED_STATES = "scored_states.jsonl"  # OUT/scored_states.jsonl: one line per state a GRPO group was drawn for
STATE_KEY = ("task_id", "step", "origin", "round")  # what names a state in a pool (unique per rl_states split)


def scored_state_files(rl_out: str | os.PathLike) -> list[Path]:
    """The scored-state logs of one rl.train output directory (one per process on several processes)."""
    files = sorted(Path(rl_out).glob("scored_states*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{rl_out}: no {SCORED_STATES}; it is written by rl.train while it trains")
    return files


class RewardRecorder:
    """What each reward function returned for the batch being scored (this process's completions, in order): the
    reward functions are TRL's public extension point, so they report their own outputs here."""

    def __init__(self):
        self.latest: dict[str, list] = {}

    def wrap(self, fn):
        """`fn` (a TRL reward function, sync or async) recording its outputs under its name; TRL logs the same name."""
        name = fn.__name__
        if inspect.iscoroutinefunction(fn):

            async def recorded(completions, **kwargs):
                self.latest[name] = out = await fn(completions, **kwargs)
                return out

        else:

            def recorded(completions, **kwargs):
                self.latest[name] = out = fn(completions, **kwargs)
                return out

        recorded.__name__ = recorded.__qualname__ = name
        return recorded


class StateRecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that writes, for every state it draws a group for while training, one JSON line to
    OUT/scored_states.jsonl (OUT/scored_states.rank<R>.jsonl per process when there are several): the optimizer
    step (completed steps when the group was drawn), the state's STATE_KEY fields, the G weighted rewards (null for a
    completion every reward skipped) and the G advantages the loss used. Lines are appended as training goes, so a
    crash keeps the groups scored so far. Why: GRPO scores a few hundred of the pool's thousands of states; this tells
    the states it trained on from those it did not (`rl.score --scored OUT`).

    The one override of a TRL method, and what it depends on (TRL 1.16, trl/trainer/grpo_trainer.py):
    `_generate_and_score_completions(inputs)` is called once per generation batch with this process's rows, G
    consecutive copies per state, calls the reward functions on them (the rewards come from RewardRecorder), and
    returns a dict whose "advantages" holds this process's advantages in the same order (the `output = {...
    "advantages": advantages ...}` at its end). tests/test_rl.py::test_trl_hooks_this_trainer_relies_on_are_there
    fails when that changes."""

    recorder: RewardRecorder
    _scored_path: Path | None = None

    def _generate_and_score_completions(self, inputs):
        self.recorder.latest = {}
        out = super()._generate_and_score_completions(inputs)
        if self.model.training and self.recorder.latest:
            self._record(inputs, out["advantages"])
        return out

    def _record(self, inputs: list[dict], advantages) -> None:
        n, g = len(inputs), self.num_generations
        per_func = torch.tensor(
            [
                [float("nan") if v is None else float(v) for v in self.recorder.latest[name]]
                for name in self.reward_func_names
            ],
            dtype=torch.float32,
        ).T
        weighted = (per_func * self.reward_weights.float().cpu().unsqueeze(0)).nansum(dim=1)
        weighted[torch.isnan(per_func).all(dim=1)] = float("nan")
        adv = advantages.float().cpu().tolist()
        lines = []
        for i in range(0, n - n % g, g):
            row = inputs[i]
            lines.append(
                {"global_step": self.state.global_step}
                | {k: row.get(k) for k in STATE_KEY}
                | {
                    "rewards": [None if r != r else round(r, 6) for r in weighted[i : i + g].tolist()],
                    "advantages": [round(a, 6) for a in adv[i : i + g]],
                }
            )
        if self._scored_path is None:  # first group of this run: start the file afresh
            rank = self.accelerator.process_index
            name = SCORED_STATES if self.accelerator.num_processes == 1 else f"scored_states.rank{rank}.jsonl"
            self._scored_path = Path(self.args.output_dir) / name
            self._scored_path.parent.mkdir(parents=True, exist_ok=True)
            self._scored_path.write_text("")
        with self._scored_path.open("a") as f:
            f.writelines(jsonio.dumps(x, nonfinite="string") + "\n" for x in lines)


def summarize(
    trainer,
    wall_s: float,
    recipe: RLRecipe,
    how: str,
    judge_stats: dict,
    n_states: int,
    *,
    weights=named_weights,
    trained_task_ids: list[str] | None = None,
) -> dict:
    """Steps, wall time and per-component reward means (first/last/mean over logged steps). `weights`: the recipe's
    reward_weights by name, in the order of the trainer's reward functions (named_weights: REWARD_FUNCS; rl.online
    passes its own); trained_task_ids: default the trainer's `trained_task_ids` (rl.train sets it)."""

    names = list(weights(recipe.training.reward_weights))
    hist = [h for h in trainer.state.log_history if "reward" in h]
    keys = ["reward"] + [f"rewards/{k}/mean" for k in names] + ["kl", "frac_reward_zero_std", "loss"]
    comp = {}
    for k in keys:
        # drop NaN and None (TRL logs a reward every completion skipped, e.g. an unweighted compute, as None)
        vals = [h[k] for h in hist if isinstance(h.get(k), int | float) and h[k] == h[k]]
        if vals:
            q = max(1, len(vals) // 4)  # one step's reward is a few states' worth: quarters show the trend
            comp[k] = {
                "mean": sum(vals) / len(vals),
                "first": vals[0],
                "last": vals[-1],
                "first_quarter_mean": sum(vals[:q]) / q,
                "last_quarter_mean": sum(vals[-q:]) / q,
            }
    short = {"reward": "reward", "kl": "kl", "frac_reward_zero_std": "zero_std"}
    short |= {f"rewards/{k}/mean": k for k in names}
    history = [{"step": h.get("step")} | {v: h[k] for k, v in short.items() if k in h} for h in hist]
    steps = trainer.state.global_step
    return {
        "steps": steps,
        "wall_time_s": round(wall_s, 2),
        "s_per_step": round(wall_s / max(1, steps), 3),
        "n_states": n_states,
        # the tasks of the states GRPO drew from: pipeline.eval warns when a planner is scored on one of them
        "trained_task_ids": (
            trained_task_ids if trained_task_ids is not None else getattr(trainer, "trained_task_ids", [])
        ),
        "num_generations": recipe.training.num_generations,
        "reference_policy": how,
        "reward_weights": weights(recipe.training.reward_weights),
        "metrics": comp,
        "judge": judge_stats,
        "compute_check": dict(get_execution_check().stats),  # programs run by the compute reward (0 when unweighted)
        "history": history,  # every logged step: reward, its components, KL, share of groups with one reward
    }


def load_state_pool(dataset_dirs: str, split: str = "train", origins: str | None = None):
    """rl_states rows of one or several DatasetDicts (comma-separated dirs), concatenated in order; rows written
    before the origin column count as teacher rows; `origins` (comma-separated, e.g. "onpolicy") keeps only those."""
    parts = []
    for d in [x.strip() for x in dataset_dirs.split(",") if x.strip()]:
        if not Path(d).exists():
            raise FileNotFoundError(f"dataset_dir {d!r} does not exist: run collect.harvest / pipeline.relabel first")
        dd = load_from_disk(d)
        if split not in dd:
            raise ValueError(f"{d}: no split {split!r} (has {list(dd)})")
        ds = dd[split]
        if "origin" not in ds.column_names:
            ds = ds.add_column("origin", ["teacher"] * len(ds)).add_column("round", [0] * len(ds))
        parts.append(ds)
    if not parts:
        raise ValueError("dataset_dir names no directory")
    cols = parts[0].column_names
    ds = concatenate_datasets([p.select_columns(cols) for p in parts]) if len(parts) > 1 else parts[0]
    if origins:
        keep = {o.strip() for o in origins.split(",") if o.strip()}
        ds = ds.filter(lambda r: r["origin"] in keep)
        if len(ds) == 0:
            raise ValueError(f"{dataset_dirs}: no {split} states of origin {sorted(keep)}")
    return ds


@contextlib.contextmanager
def reference_built_like(policy):
    """While GRPOTrainer is constructed, build its KL reference with the policy's own class.

    TRL 1.16 creates the reference with `create_model_from_path(get_config_model_id(self.model.config), ...)`, which
    instantiates `config.architectures[0]`: for a vision-language checkpoint (Qwen3.5's SFT OUT/merged keeps the
    original checkpoint's layout, for vLLM) that is the ConditionalGeneration class while the policy was loaded as a
    CausalLM, so the KL term would compare two different models. TRL has no argument for the reference's class, so
    `architecture` is pinned here; `build_trainer` checks the result, and
    tests/test_rl.py::test_trl_hooks_this_project_relies_on_are_there fails if TRL stops building it this way."""
    cls = type(policy)
    with mock.patch.object(
        grpo_trainer,
        "create_model_from_path",
        functools.partial(grpo_trainer.create_model_from_path, architecture=cls),
    ):
        yield cls


def states_calling(ds, tools: str):
    """The states of `ds` whose reference decision calls one of `tools` (comma-separated names); none is an error."""

    keep = {t.strip() for t in tools.split(",") if t.strip()}
    ds = ds.filter(lambda r: (load_json_column(r["reference_action"], "reference_action") or {}).get("name") in keep)
    if len(ds) == 0:
        raise ValueError(f"reference_tools {sorted(keep)}: no state's reference decision calls them")
    return ds


def build_trainer(recipe: RLRecipe):
    """Data, policy, rewards and GRPOTrainer for one recipe. Returns (trainer, tokenizer, judge, how, n_states)."""
    script, training, model_args = recipe
    # 1. data: the recorded state pool (teacher and/or on-policy states); prompts rendered with each row's tools
    ds = load_state_pool(script.dataset_dir, script.train_split, script.origins)
    if script.reference_tools:
        ds = states_calling(ds, script.reference_tools)
    if script.max_train_samples:
        ds = ds.select(range(min(script.max_train_samples, len(ds))))
    model, tok, peft_config, how = load_policy(model_args)
    ds = render_prompts(ds, tok, training.chat_template_kwargs)
    trainer_task_ids = sorted(set(ds["task_id"])) if "task_id" in ds.column_names else []
    log.info("%d states from %s; policy %s (%s)", len(ds), script.dataset_dir, model_args.model_name_or_path, how)

    # 2. rewards: valid, gate (rules) + target, align (one judge call each candidate) + compute (programs run; only
    #    when the recipe weighs it), each recording what it returned for the scored-states log
    judge = use_judge(build_judge(script.judge))
    use_execution_check(ExecutionCheck())  # a fresh memo of program outputs for this run
    recorder = RewardRecorder()
    reward_funcs = [recorder.wrap(f) for f in trainer_reward_funcs(named_weights(training.reward_weights))]

    # 3. GRPO with the recipe's objective
    compact_lm_head_on_cpu()  # CPU only: the policy's log-probs over completion tokens only (same loss, faster)
    trainer = build_grpo_trainer(
        StateRecordingGRPOTrainer,
        model,
        model_args,
        how,
        reward_funcs=reward_funcs,
        args=training,
        train_dataset=ds,
        processing_class=tok,
        peft_config=peft_config,
    )
    trainer.recorder = recorder
    trainer.trained_task_ids = trainer_task_ids
    return trainer, tok, judge, how, len(ds)


def build_grpo_trainer(trainer_cls, model, model_args: ModelConfig, how: str, **kwargs):
    """`trainer_cls(model=model, **kwargs)` (GRPOTrainer or a subclass) with its KL reference built in the policy's
    class (reference_built_like) and checked (check_kl_reference): the one way rl.train and rl.online build theirs."""
    with reference_built_like(model):
        trainer = trainer_cls(model=model, **kwargs)
    check_kl_reference(trainer, model, model_args, how)
    return trainer


def check_kl_reference(trainer, model, model_args: ModelConfig, how: str) -> None:
    """The KL reference of a full-weights policy must be the SFT checkpoint in the policy's class: TRL builds it from
    the checkpoint's config.architectures[0], and a vision-language checkpoint names its ConditionalGeneration class
    there. RuntimeError saying what to do otherwise; nothing to check without a KL term or with an adapter."""
    if not trainer.beta or how != "full_ft_ref_loaded_from_sft_checkpoint":
        return
    ref = trainer.accelerator.unwrap_model(trainer.ref_model) if trainer.ref_model is not None else None
    ref_src = getattr(ref.config, "_name_or_path", None) if ref is not None else None
    if ref_src is None or Path(ref_src).resolve() != Path(model_args.model_name_or_path).resolve():
        raise RuntimeError(f"KL reference {ref_src!r} is not the SFT checkpoint {model_args.model_name_or_path!r}")
    if type(ref) is not type(model):
        raise RuntimeError(
            f"KL reference is a {type(ref).__name__} (config.architectures of {ref_src}), the policy a "
            f"{type(model).__name__}: train with use_peft: true (the reference is then the adapter disabled), "
            "or save the SFT checkpoint from the policy's class"
        )


def save_policy(trainer, tok, out: str | os.PathLike) -> None:
    """The trained policy (+ tokenizer) in OUT, loadable as every checkpoint planner is (pipeline.planners): the full
    weights, or the policy adapter without TRL's frozen "ref" copy of the SFT adapter."""
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(unwrapped, "peft_config") and "ref" in unwrapped.peft_config:
        # the frozen reference copy of the SFT adapter is not part of the trained policy: save "default" only
        if trainer.accelerator.is_main_process:
            unwrapped.save_pretrained(str(out), selected_adapters=["default"])
    else:
        trainer.save_model(str(out))
    tok.save_pretrained(str(out))


def train(recipe: RLRecipe):
    """Run GRPO for one recipe; returns (trainer, summary). Writes OUT/ and OUT/rl_summary.json."""
    trainer, tok, judge, how, n_states = build_trainer(recipe)
    t0 = time.time()
    trainer.train()
    wall = time.time() - t0

    # 4. outputs: final policy (+ tokenizer) and the run summary
    out = Path(recipe.training.output_dir)
    save_policy(trainer, tok, out)
    summary = summarize(trainer, wall, recipe, how, dict(judge.stats), n_states)
    summary["config"] = {
        "script": asdict(recipe.script),
        "model": asdict(recipe.model),
        "grpo": recipe.training.to_dict(),
    }
    if trainer.accelerator.is_main_process:
        jsonio.write_json(out / "rl_summary.json", summary, default=str)  # a NaN metric is written as "NaN"
        m = summary["metrics"]
        log.info(
            "done: %d steps in %.1fs (%.2f s/step); reward means %s",
            summary["steps"],
            wall,
            summary["s_per_step"],
            {k: round(v["mean"], 3) for k, v in m.items() if k.startswith("reward")},
        )
    return trainer, summary


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    _, summary = train(parse_args(argv))
    return summary


if __name__ == "__main__":
    run_cli(main, "training stopped; OUT holds no final model (rerun to train again)", errors=(FileNotFoundError,))
