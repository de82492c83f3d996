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
    reference from the same path, i.e. the SFT checkpoint, with the policy's own class (TRL would otherwise pick the
    class named in config.architectures[0], e.g. a vision-language ConditionalGeneration class for a CausalLM policy);
  * full weights + ``use_peft: true``: a fresh adapter on the SFT weights; TRL's reference is the model with the
    adapter disabled = the SFT weights;
  * a LoRA adapter directory (adapter_config.json): loaded as a trainable PeftModel; TRL copies the SFT adapter into a
    frozen "ref" adapter (stack.md), which is removed before saving.
Prompts are pre-rendered with the policy tokenizer's chat template INCLUDING each row's tools (a static dataset cannot
feed a per-row tools column to TRL's own rendering). Writes OUT (model + tokenizer) and OUT/rl_summary.json.
"""

from __future__ import annotations

import contextlib
import functools
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

from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config

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
    reference_candidate: bool = field(
        default=False,
        metadata={
            "help": "replace one of each state's G sampled candidates by the state's recorded reference decision "
            "(the teacher's action, rendered as SFT trains on it), scored by the same rewards; the paper samples all G"
        },
    )
    placebo_rewards: bool = field(
        default=False,
        metadata={
            "help": "control run: each group's G rewards are randomly permuted among its G completions before the "
            "advantage, so updates have the real run's sizes and no information about which completion was better"
        },
    )
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
    from rewards import DEFAULT_WEIGHTS, PAPER_REWARDS, REWARD_FUNCS, weights_list

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


def named_weights_flag(argv: list[str] | None) -> list[str] | None:
    """`--reward_weights '{"compute": 0.3, ...}'` (a JSON mapping by reward name, as a recipe's YAML mapping; what
    sft.onpolicy's rl_args and load_config pass for a mapping) becomes TRL's list of floats in REWARD_FUNCS order."""
    if not argv:
        return argv
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a in ("--reward_weights", "--reward-weights") and out[i + 1].lstrip().startswith("{"):
            try:
                mapping = json.loads(out[i + 1])
            except json.JSONDecodeError as e:
                raise ValueError(f"--reward_weights: not a JSON mapping: {e}: {out[i + 1]!r}") from None
            out[i + 1 : i + 2] = [str(w) for w in named_weights(mapping).values()]
            break
    return out


def parse_args(argv: list[str] | None = None) -> RLRecipe:
    """YAML recipe (--config) + command-line overrides. Unknown recipe keys are an error that names the file.

    Without CUDA the defaults become use_cpu/fp32 before GRPOConfig validates itself (it rejects bf16 on a CPU-only
    machine), as in sft.train; a recipe that sets bf16: true still needs `--bf16 false` there."""
    import torch

    argv = named_weights_flag(list(argv) if argv is not None else sys.argv[1:])
    parser = TrlParser((RLScriptArguments, GRPOConfig, ModelConfig))
    if not torch.cuda.is_available():
        parser.set_defaults(use_cpu=True, bf16=False)
    path = argv[argv.index("--config") + 1] if argv and "--config" in argv else None
    try:
        script, training, model = parser.parse_args_and_config(args=argv)
    except ValueError as e:
        raise ValueError(f"{path}: {e}" if path else str(e)) from None
    # TRL wants a list in REWARD_FUNCS order; recipes may name the weights (validated either way)
    training.reward_weights = list(named_weights(training.reward_weights).values())
    return RLRecipe(script, training, model)


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> RLRecipe:
    """parse_args for callers holding a recipe path and a few overrides ({field: value}, None = not given)."""
    argv = ["--config", str(path)] if path else []
    for k, v in (overrides or {}).items():
        if v is None:
            continue
        if isinstance(v, list | tuple):
            argv += [f"--{k}", *map(str, v)]
        else:
            argv += [f"--{k}", json.dumps(v) if isinstance(v, dict) else str(v)]
    return parse_args(argv)


def is_adapter_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "adapter_config.json").exists()


def load_policy(model_args: ModelConfig):
    """(model, tokenizer, peft_config, how) for the post-SFT policy; see the module docstring for the three cases."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
        from peft import PeftConfig, PeftModel

        if model_args.use_peft:
            raise ValueError(f"{path} is already a LoRA adapter; set use_peft: false (TRL refuses both)")
        base = PeftConfig.from_pretrained(path).base_model_name_or_path
        tok_src = path if (Path(path) / "tokenizer_config.json").exists() else base
        tok = AutoTokenizer.from_pretrained(tok_src)
        model = AutoModelForCausalLM.from_pretrained(base, **kwargs)
        model = PeftModel.from_pretrained(model, path, is_trainable=True)
        return model, tok, None, "sft_adapter_copied_to_ref_adapter"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if model_args.use_peft:
        return model, tok, get_peft_config(model_args), "new_adapter_ref_is_sft_weights"
    return model, tok, None, "full_ft_ref_loaded_from_sft_checkpoint"


def render_prompts(ds, tok, chat_template_kwargs: dict | None):
    """Replace each row's message list by the policy's chat-template text with that row's tools in the header.

    The messages go through collect.harvest.template_messages first, as state-SFT's rows do, so a prompt that replays
    an earlier tool call in the OpenAI wire form renders for GRPO exactly as SFT trained on it (and as vLLM serves it);
    Qwen3.5's template rejects the wire form's string arguments."""
    from collect.harvest import template_messages
    from rewards.rules import load_json_column

    kwargs = dict(chat_template_kwargs or {})

    def one(row):
        tools = load_json_column(row["tools"], "tools")
        text = tok.apply_chat_template(
            template_messages(row["prompt"]), tools=tools or None, add_generation_prompt=True, tokenize=False, **kwargs
        )
        return {"prompt": text}

    return ds.map(one, desc="render prompts")


GUIDE_COLUMN = "reference_completion_ids"


def add_reference_completions(ds, tok, chat_template_kwargs: dict | None, eos_ids: list[int] | None = None):
    """Each state's reference decision as completion token ids (column GUIDE_COLUMN), before render_prompts.

    The completion is what state-SFT trains on for that row: the chat template's rendering of the prompt plus the
    assistant tool call (collect.harvest.decision_completion) minus the rendering of the prompt with the generation
    prompt, tokenized as one text, as TRL's SFT does for prompt-completion rows, then cut after the first
    end-of-sequence token (`eos_ids`, default the tokenizer's), where generation stops: a template's newline after
    <|im_end|> is trained by SFT but never sampled. A template that does not render the prompt as a prefix of the
    conversation is an error."""
    from collect.actions import Action
    from collect.harvest import decision_completion, template_messages
    from rewards.rules import load_json_column

    kwargs = dict(chat_template_kwargs or {})
    eos = set(eos_ids if eos_ids is not None else [tok.eos_token_id])

    def one(row):
        tools = load_json_column(row["tools"], "tools")
        ref = load_json_column(row["reference_action"], "reference_action")
        action = Action(ref["name"], ref.get("arguments") or {})
        messages = template_messages(row["prompt"])
        common = {"tools": tools or None, "tokenize": False, **kwargs}
        head = tok.apply_chat_template(messages, add_generation_prompt=True, **common)
        full = tok.apply_chat_template(messages + decision_completion(action), **common)
        head_ids = tok(head, add_special_tokens=False)["input_ids"]
        full_ids = tok(full, add_special_tokens=False)["input_ids"]
        if full_ids[: len(head_ids)] != head_ids:
            raise ValueError(
                f"state {row.get('task_id')}#{row.get('step')}: the chat template does not render the prompt as a "
                "prefix of prompt + reference decision; reference_candidate cannot build the candidate"
            )
        ids = full_ids[len(head_ids) :]
        ends = [k for k, t in enumerate(ids) if t in eos]
        return {GUIDE_COLUMN: ids[: ends[0] + 1] if ends else ids}

    return ds.map(one, desc="reference candidates")


SCORED_STATES = "scored_states.jsonl"  # OUT/scored_states.jsonl: one line per state a GRPO group was drawn for
STATE_KEY = ("task_id", "step", "origin", "round")  # what names a state in a pool (unique per rl_states split)


def scored_state_files(rl_out: str | os.PathLike) -> list[Path]:
    """The scored-state logs of one rl.train output directory (one per process on several processes)."""
    files = sorted(Path(rl_out).glob("scored_states*.jsonl"))
    if not files:
        raise FileNotFoundError(f"{rl_out}: no {SCORED_STATES}; it is written by rl.train while it trains")
    return files


def shuffle_within_groups(rewards, g: int, seed: int):
    """`rewards` (N x F: a row per completion, G consecutive rows per state) with each group's rows randomly
    permuted (one permutation per group, the same for every reward function; seeded). Rows past the last whole group
    are left in place."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = rewards.shape[0] - rewards.shape[0] % g
    perm = torch.cat(
        [torch.randperm(g, generator=gen) + i for i in range(0, n, g)] + [torch.arange(n, rewards.shape[0])]
    )
    return rewards[perm.to(rewards.device)]


class StateRecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that writes, for every state it draws a group for while training, one JSON line to
    OUT/scored_states.jsonl (OUT/scored_states.rank<R>.jsonl per process when there are several): the optimizer
    step (completed steps when the group was drawn), the state's STATE_KEY fields, the G weighted rewards (null for a
    completion every reward skipped; as the loss saw them, i.e. permuted in a placebo run) and the G advantages the
    loss used. Lines are appended as training goes, so a crash keeps the groups scored so far. Why: GRPO scores a
    few hundred of the pool's thousands of states; this tells the states it trained on from those it did not
    (`rl.score --scored OUT`). Also the home of the `placebo_rewards` control (shuffle_within_groups)."""

    _rewards_per_func = None
    _scored_path: Path | None = None
    placebo_rewards = False  # RLScriptArguments.placebo_rewards: a control run (shuffle_within_groups)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.placebo_rewards and self.model.training:  # the same permutation on every process (same seed)
            rewards = shuffle_within_groups(
                rewards, self.num_generations, self.args.seed * 1_000_003 + self.state.global_step
            )
        self._rewards_per_func = rewards  # gathered over processes, as TRL uses it
        return rewards

    def _generate_and_score_completions(self, inputs):
        self._rewards_per_func = None
        out = super()._generate_and_score_completions(inputs)
        if self.model.training and self._rewards_per_func is not None:
            self._record(inputs, out["advantages"])
        return out

    def _record(self, inputs: list[dict], advantages) -> None:
        import torch

        n, g = len(inputs), self.num_generations
        rank = self.accelerator.process_index
        per_func = self._rewards_per_func[rank * n : (rank + 1) * n].float().cpu()
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
            name = SCORED_STATES if self.accelerator.num_processes == 1 else f"scored_states.rank{rank}.jsonl"
            self._scored_path = Path(self.args.output_dir) / name
            self._scored_path.parent.mkdir(parents=True, exist_ok=True)
            self._scored_path.write_text("")
        with self._scored_path.open("a") as f:
            f.writelines(jsonio.dumps(x, nonfinite="string") + "\n" for x in lines)


class ReferenceGuidedGRPOTrainer(StateRecordingGRPOTrainer):
    """GRPO whose groups hold the recorded reference decision as one of the G candidates (RLScriptArguments
    .reference_candidate). Why: on a student's own states the teacher's decision is rarely sampled (docs/training.md
    "The demo"), so no group can rank it above the wrong ones; with it in the group its advantage is its reward
    against the sampled ones, the same rewards score it, and the clipped objective and KL term are unchanged.

    In each process's generation batch, the last candidate of each prompt is replaced by the reference's tokens
    (add_reference_completions, capped at max_completion_length). Its sampling log-probs, where the backend
    returns them (vLLM), are None, which TRL treats as "no importance-sampling correction" for those tokens.
    Logged per step: guide/advantage (mean advantage of the reference candidates), guide/above_mean (share of them
    with a positive advantage)."""

    _guide: list | None = None
    _guided: list[int] = []

    def _generate_and_score_completions(self, inputs):
        self._guide = [x.get(GUIDE_COLUMN) for x in inputs] if self.model.training else None
        self._guided = []
        try:
            out = super()._generate_and_score_completions(inputs)
        finally:
            self._guide = None
        if self._guided:
            adv = out["advantages"][self._guided].float()
            self._metrics["train"]["guide/advantage"].append(adv.mean().item())
            self._metrics["train"]["guide/above_mean"].append((adv > 0).float().mean().item())
        return out

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        guide = self._guide
        if not guide or len(guide) != len(completion_ids):
            return completion_ids, logprobs
        last = {tuple(p): i for i, p in enumerate(prompt_ids)}  # inputs arrive as G consecutive copies per state
        completion_ids = list(completion_ids)
        for i in sorted(last.values()):
            ref = list(guide[i] or [])[: self.max_completion_length]
            if not ref:
                continue
            completion_ids[i] = ref
            if logprobs is not None:
                logprobs[i] = [None] * len(ref)
            self._guided.append(i)
        return completion_ids, logprobs


def summarize(trainer, wall_s: float, recipe: RLRecipe, how: str, judge_stats: dict, n_states: int) -> dict:
    """Steps, wall time and per-component reward means (first/last/mean over logged steps)."""
    from rewards import REWARD_FUNCS, get_execution_check

    hist = [h for h in trainer.state.log_history if "reward" in h]
    keys = ["reward"] + [f"rewards/{k}/mean" for k in REWARD_FUNCS] + ["kl", "frac_reward_zero_std", "loss"]
    keys += ["guide/advantage", "guide/above_mean"]
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
    short |= {f"rewards/{k}/mean": k for k in REWARD_FUNCS}
    short |= {"guide/advantage": "guide_advantage", "guide/above_mean": "guide_above_mean"}
    history = [{"step": h.get("step")} | {v: h[k] for k, v in short.items() if k in h} for h in hist]
    steps = trainer.state.global_step
    return {
        "steps": steps,
        "wall_time_s": round(wall_s, 2),
        "s_per_step": round(wall_s / max(1, steps), 3),
        "n_states": n_states,
        "num_generations": recipe.training.num_generations,
        "reference_candidate": recipe.script.reference_candidate,
        "reference_policy": how,
        "reward_weights": named_weights(recipe.training.reward_weights),
        "metrics": comp,
        "judge": judge_stats,
        "compute_check": dict(get_execution_check().stats),  # programs run by the compute reward (0 when unweighted)
        "history": history,  # every logged step: reward, its components, KL, share of groups with one reward
    }


@contextlib.contextmanager
def reference_built_like(policy):
    """While GRPOTrainer is constructed, build its KL reference with the policy's own class.

    TRL 1.16 creates the reference with `create_model_from_path(config._name_or_path)`, which instantiates
    `config.architectures[0]`: for a vision-language checkpoint that is the ConditionalGeneration class while the
    policy was loaded as a CausalLM, so the KL term would compare two different models. Passing `architecture`
    pins the class; `build_trainer` checks the result."""
    from trl.trainer import grpo_trainer

    cls = type(policy)
    with mock.patch.object(
        grpo_trainer,
        "create_model_from_path",
        functools.partial(grpo_trainer.create_model_from_path, architecture=cls),
    ):
        yield cls


def states_calling(ds, tools: str):
    """The states of `ds` whose reference decision calls one of `tools` (comma-separated names); none is an error."""
    from rewards.rules import load_json_column

    keep = {t.strip() for t in tools.split(",") if t.strip()}
    ds = ds.filter(lambda r: (load_json_column(r["reference_action"], "reference_action") or {}).get("name") in keep)
    if len(ds) == 0:
        raise ValueError(f"reference_tools {sorted(keep)}: no state's reference decision calls them")
    return ds


def build_trainer(recipe: RLRecipe):
    """Data, policy, rewards and GRPOTrainer for one recipe. Returns (trainer, tokenizer, judge, how, n_states)."""
    script, training, model_args = recipe
    # 1. data: the recorded state pool; prompts rendered with each row's tools
    from collect.relabel import load_state_pool  # teacher and/or on-policy (student-reached) states

    ds = load_state_pool(script.dataset_dir, script.train_split, script.origins)
    if script.reference_tools:
        ds = states_calling(ds, script.reference_tools)
    if script.max_train_samples:
        ds = ds.select(range(min(script.max_train_samples, len(ds))))
    model, tok, peft_config, how = load_policy(model_args)
    if script.reference_candidate:
        eos = model.generation_config.eos_token_id  # where sampling stops, as GRPOTrainer reads it
        eos = [tok.eos_token_id] + ([eos] if isinstance(eos, int) else list(eos or []))
        ds = add_reference_completions(ds, tok, training.chat_template_kwargs, eos)
    ds = render_prompts(ds, tok, training.chat_template_kwargs)
    log.info("%d states from %s; policy %s (%s)", len(ds), script.dataset_dir, model_args.model_name_or_path, how)

    # 2. rewards: valid, gate (rules) + target, align (one judge call each candidate) + compute (programs run; only
    #    when the recipe weighs it)
    from rewards import ExecutionCheck, build_judge, trainer_reward_funcs, use_execution_check, use_judge

    judge = use_judge(build_judge(script.judge))
    use_execution_check(ExecutionCheck())  # a fresh memo of program outputs for this run

    # 3. GRPO with the recipe's objective; the reference is built with the policy's class
    from sft.lm_head import compact_lm_head_on_cpu

    compact_lm_head_on_cpu()  # CPU only: the policy's log-probs over completion tokens only (same loss, faster)
    with reference_built_like(model) as policy_cls:
        trainer_cls = ReferenceGuidedGRPOTrainer if script.reference_candidate else StateRecordingGRPOTrainer
        trainer = trainer_cls(
            model=model,
            reward_funcs=trainer_reward_funcs(named_weights(training.reward_weights)),
            args=training,
            train_dataset=ds,
            processing_class=tok,
            peft_config=peft_config,
        )
    trainer.placebo_rewards = script.placebo_rewards
    if training.beta and how == "full_ft_ref_loaded_from_sft_checkpoint":
        ref = trainer.accelerator.unwrap_model(trainer.ref_model) if trainer.ref_model is not None else None
        ref_src = getattr(ref.config, "_name_or_path", None) if ref is not None else None
        if ref_src is None or Path(ref_src).resolve() != Path(model_args.model_name_or_path).resolve():
            raise RuntimeError(f"KL reference {ref_src!r} is not the SFT checkpoint {model_args.model_name_or_path!r}")
        if type(ref) is not policy_cls:
            raise RuntimeError(f"KL reference is a {type(ref).__name__}, the policy a {policy_cls.__name__}")
    return trainer, tok, judge, how, len(ds)


def train(recipe: RLRecipe):
    """Run GRPO for one recipe; returns (trainer, summary). Writes OUT/ and OUT/rl_summary.json."""
    trainer, tok, judge, how, n_states = build_trainer(recipe)
    t0 = time.time()
    trainer.train()
    wall = time.time() - t0

    # 4. outputs: final policy (+ tokenizer) and the run summary
    out = Path(recipe.training.output_dir)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(unwrapped, "peft_config") and "ref" in unwrapped.peft_config:
        # the frozen reference copy of the SFT adapter is not part of the trained policy: save "default" only
        if trainer.accelerator.is_main_process:
            unwrapped.save_pretrained(str(out), selected_adapters=["default"])
    else:
        trainer.save_model(str(out))
    tok.save_pretrained(str(out))
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
    main()
