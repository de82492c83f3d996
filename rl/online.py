"""Online GRPO in the ledger runtime: decisions sampled at states the current planner reaches, executed for real.

    python -m rl.online --config configs/rl/online_tiny.yaml [--model_name_or_path SFT] [--output_dir OUT]
                        [--max_steps N] [--overwrite true] [any other GRPOConfig / ModelConfig field]

rl.train scores G sampled decisions per *recorded teacher state* and executes none of them. Here one GRPO group is
one train task, run through the real runtime (collect.loop) by the policy being trained:

  1. scout   the policy plays the task from S_0 to its end (start_run / step, the collect engine's loop, the
             recipe's critic, finalizer and need parser); every state where it was asked for a decision is kept
             (Run.fork: the ledger is frozen, so a snapshot is cheap).
  2. anchor  one of those states, drawn uniformly (anchor_step: a fixed one); its prompt is rendered for the policy
             exactly as harvest / state-SFT / rl.train render a state (rl.train.render_prompt with that task's
             tools), and G decisions are sampled there in one call: a row's prompt_ids are those ids, its
             completion_ids the generated ids (never re-tokenised), its logprobs the sampling log-probs.
  3. forks   each decision is executed in its own fork of the anchor state (tool -> critic -> reducer; finish ->
             gate -> finalizer -> answer critic, as the runtime does), then the policy continues the fork to the
             task's end within the runtime budget (runtime.max_steps, counted from S_0), and the answer is judged.
  4. rewards side by side, weighted by name (reward_weights): the per-decision rewards of rl.train on (anchor
             state, decision) -- valid, gate, target, align (the recipe's judge; reference = the offline teacher
             planner's decision at the anchor) and compute when weighed --, `closed` (what the executed decision
             closed in the ledger) and `outcome` (1 when the fork's final answer is judged correct, "insufficient"
             on an unanswerable task included).

The hook is TRL's public `rollout_func` (GRPOTrainer(rollout_func=f)): TRL 1.16 calls f(prompts, trainer) with this
process's prompts, G consecutive copies per group, and takes exactly len(prompts) rows back (prompt_ids,
completion_ids, logprobs); every further key reaches the reward functions per row. The rewards are computed here,
where the episodes are, and handed over as `reward_<name>` keys that the reward functions return as they are; TRL
then normalises them within each group as it does for every trainer. The trainer is GRPOTrainer itself: nothing of
TRL is subclassed or overridden (tests/test_rl_online.py checks it).

Generation: on CPU (and any run without vLLM) the trainer's model generates without grad with TRL's own
generation config (the recipe's temperature, top_p, top_k, max_completion_length); the log-probs are those of the
processed scores it sampled from. With `use_vllm: true` (GPU; configs/rl/online_qwen3_5_27b.yaml colocates it) TRL's
own vLLM engine generates (trainer.vllm_generation.generate, which TRL keeps in sync with the policy before each
rollout) and returns vLLM's sampling log-probs, which TRL's importance-sampling correction uses; `tool_call_parser`
(qwen3_coder for Qwen3.5) reads the calls with vLLM's own parser, as serving does. The forks of all groups run
concurrently; their planner calls are batched into one generation call whenever they wait together.

Writes OUT/ (model + tokenizer, a checkpoint planner like any other), OUT/online_groups.jsonl (one line per group:
step, task, anchor, the G rewards per component, their weighted totals and advantages, episodes and tool calls run),
OUT/rl_summary.json (rl.train's summary plus the per-component means over groups, episodes and tool calls, episodes
per hour), OUT/online_run.json (the recipe's hash). Resume: a rerun with the same OUT and recipe continues from the
last Trainer checkpoint in OUT (checkpoint-N: weights, optimizer, scheduler, RNG and step; save_steps in the recipe)
and keeps the group lines of the steps before it; a finished run is not redone; another recipe is refused unless
--overwrite true.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import inspect
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from collect import jsonio

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: models are local paths
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL 1.16: we know

import torch
from datasets import Dataset
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

from collect import loop
from collect.actions import offered_refs
from collect.cli import run_cli
from collect.config import RuntimeConfig, ToolsConfig, from_mapping
from collect.config import load_config as load_collect_config
from collect.harvest import EVAL_SPLITS
from collect.ledger import Ledger, TaskContext, digest, state_hash
from collect.llm import ChatError, ClientPool
from collect.roles.base import PlannerReply, Usage
from collect.roles.factory import build_roles
from collect.run import engine_answer, judge_answer, load_task_corpus, load_task_list, setup_logging
from collect.teacher import TeacherPlanner
from collect.tools import ToolBox
from rewards import REWARD_FUNCS, ExecutionCheck, build_judge, use_execution_check, use_judge
from rl.train import (
    RLRecipe,
    build_grpo_trainer,
    load_policy,
    parse_recipe,
    recipe_argv,
    reference_policy,
    render_prompt,
    save_policy,
)
from rl.train import summarize as summarize_training

log = logging.getLogger("rl.online")

DECISION_REWARDS = ("valid", "gate", "target", "align", "compute")  # rl.train's, on (anchor state, decision)
ONLINE_REWARDS = (*DECISION_REWARDS, "closed", "outcome")  # + what the executed decision and its episode did
DEFAULT_WEIGHTS = {
    "valid": 0.1,
    "gate": 0.1,
    "target": 0.2,
    "align": 0.6,
    "compute": 0.0,
    "closed": 0.5,
    "outcome": 1.0,
}
SKIPPED_WHEN_UNWEIGHTED = ("compute",)  # runs programs: not computed at all while its weight is 0
GROUPS_LOG = "online_groups.jsonl"
RUN_META = "online_run.json"
SUMMARY = "rl_summary.json"  # the name pipeline.planners.trained_task_ids follows back to the SFT checkpoint


class OnlineRunError(ValueError):
    """A recipe or OUT this stage refuses (an evaluation split, another recipe's OUT, ...); the message says why."""


def online_weights(weights) -> dict[str, float]:
    """reward_weights by reward name in ONLINE_REWARDS order, from a mapping (missing names: DEFAULT_WEIGHTS), TRL's
    list (one weight per ONLINE_REWARDS name) or None (DEFAULT_WEIGHTS). Unknown names are an error."""
    if weights is None:
        return dict(DEFAULT_WEIGHTS)
    if isinstance(weights, dict):
        unknown = sorted(set(weights) - set(ONLINE_REWARDS))
        if unknown:
            raise ValueError(f"unknown reward weight(s) {unknown}; known: {list(ONLINE_REWARDS)}")
        return {k: float(weights.get(k, DEFAULT_WEIGHTS[k])) for k in ONLINE_REWARDS}
    if len(weights) != len(ONLINE_REWARDS):
        raise ValueError(
            f"reward_weights: {len(weights)} values for the {len(ONLINE_REWARDS)} online rewards "
            f"{list(ONLINE_REWARDS)} (or give a mapping by name)"
        )
    return dict(zip(ONLINE_REWARDS, map(float, weights), strict=True))


@dataclass
class OnlineScriptArguments:
    """Stage options that are neither GRPO hyper-parameters (GRPOConfig) nor model options (ModelConfig)."""

    collect: str = field(
        default="configs/collect/embedded.yaml",
        metadata={"help": "collect recipe: the task source, tools, runtime and the fixed roles (need parser, critic, "
                  "finalizer, answer critic); its planner is replaced by the policy being trained"},
    )  # fmt: skip
    split: str = field(default="train", metadata={"help": "task split to train on (never dev / test)"})
    limit: int | None = field(default=None, metadata={"help": "the first N tasks of the split"})
    runtime: dict | str | None = field(
        default=None, metadata={"help": "RuntimeConfig overrides of the collect recipe's runtime (e.g. max_steps)"}
    )
    judge: dict | str | None = field(
        default_factory=lambda: {"kind": "offline"},
        metadata={"help": "rewards.judge.JudgeConfig of the target / align rewards (YAML mapping or JSON)"},
    )
    anchor_step: int | None = field(
        default=None,
        metadata={"help": "anchor at the scout's k-th decision state (0 = S_0; clipped to the last one it reached); "
                  "default: drawn uniformly over the states it reached"},
    )  # fmt: skip
    tool_call_parser: str | None = field(
        default=None,
        metadata={"help": "vLLM tool-call parser that turns the policy's text into tool calls, as serving does "
                  "(serve.vllm.TOOL_CALL_PARSERS: qwen3_coder for Qwen3.5's XML calls; needs vLLM); default: the "
                  "runtime parses the hermes <tool_call>{json}</tool_call> text itself (tiny, Qwen2.5/3, Omni)"},
    )  # fmt: skip
    overwrite: bool = field(default=False, metadata={"help": "start OUT afresh even if it holds another run"})

    def __post_init__(self):
        for name in ("judge", "runtime"):
            v = getattr(self, name)
            if isinstance(v, str):
                setattr(self, name, json.loads(v))
            setattr(self, name, dict(getattr(self, name) or {}))


def parse_args(argv: list[str] | None = None) -> RLRecipe:
    """An online recipe (YAML + command-line overrides): (OnlineScriptArguments, GRPOConfig, ModelConfig)."""
    recipe = parse_recipe(argv, OnlineScriptArguments, online_weights)
    check_recipe(recipe)
    return recipe


def load_config(path: str | None, overrides: dict[str, Any] | None = None) -> RLRecipe:
    return parse_args(recipe_argv(path, overrides))


def check_recipe(recipe: RLRecipe) -> None:
    """What this stage needs of the GRPO settings, refused before anything is built."""
    script, training, _ = recipe
    if script.split in EVAL_SPLITS or script.split == "all":
        raise OnlineRunError(
            f"split {script.split!r}: online GRPO trains only on train tasks (collect.harvest.EVAL_SPLITS "
            f"{list(EVAL_SPLITS)} are held out); set split: train"
        )
    if training.multi_objective_aggregation != "sum_then_normalize":
        raise OnlineRunError(
            "multi_objective_aggregation: rl.online logs the group advantages of TRL's sum_then_normalize only; "
            "remove the key"
        )
    per_process = training.per_device_train_batch_size * training.steps_per_generation
    if per_process % training.num_generations:
        raise OnlineRunError(
            f"per_device_train_batch_size x steps_per_generation = {per_process} is not a multiple of "
            f"num_generations {training.num_generations}: each process's rollout must hold whole groups (one group "
            "is one task's episodes)"
        )
    if training.use_vllm and training.vllm_mode not in ("colocate", "server"):
        raise OnlineRunError(f"vllm_mode {training.vllm_mode!r}: expected colocate or server")


# ---- generation -----------------------------------------------------------------------------------------------------


@dataclass
class Sample:
    """One generated reply: the prompt's ids, the generated ids as generated (up to and including the first end of
    turn), their sampling log-probs, and the text the runtime parses (decoded like TRL decodes a completion)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str


@dataclass
class Request:
    """n samples wanted for one prompt; `context` is the planner call's (messages, tools, r0, ledger): a scripted
    generator (tests) may read it, the model backends ignore it."""

    prompt_ids: list[int]
    n: int
    context: dict = field(default_factory=dict)


class TransformersGenerator:
    """The trainer's model generates, without grad, with TRL's generation config (GRPOTrainer.generation_config: the
    recipe's temperature, top_p, top_k, max_completion_length; TRL builds it when use_vllm is off). Prompts of one
    batch are left-padded as TRL pads them; log-probs are log-softmax of the processed scores sampled from."""

    def __init__(self, trainer: GRPOTrainer):
        self.trainer = trainer
        self.config = copy.deepcopy(trainer.generation_config)
        self.config.output_scores = self.config.return_dict_in_generate = True

    def __call__(self, requests: list[Request]) -> list[list[Sample]]:
        from trl.models import unwrap_model_for_generation
        from trl.trainer.utils import pad

        t = self.trainer
        tok = t.processing_class
        rows = [r.prompt_ids for r in requests for _ in range(r.n)]
        device = t.accelerator.device
        ids = pad([torch.tensor(x) for x in rows], padding_value=tok.pad_token_id, padding_side="left").to(device)
        mask = pad([torch.ones(len(x), dtype=torch.long) for x in rows], padding_value=0, padding_side="left")
        with (
            unwrap_model_for_generation(
                t.model_wrapped,
                t.accelerator,
                gather_deepspeed3_params=t.args.ds3_gather_for_generation,
                generation_kwargs=t.generation_kwargs,
                gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                input_ids=ids,
                attention_mask=mask.to(device),
                generation_config=self.config,
            )
        gen = out.sequences[:, ids.shape[1] :].cpu()
        scores = torch.stack(out.scores, dim=1).float().cpu()  # (rows, new tokens, vocab): what was sampled from
        logps = scores.log_softmax(-1).gather(-1, gen.unsqueeze(-1)).squeeze(-1)
        eos = set(t.eos_token_ids)
        samples = []
        for i, prompt in enumerate(rows):
            seq = gen[i].tolist()
            end = next((j + 1 for j, x in enumerate(seq) if x in eos), len(seq))
            comp = seq[:end]
            lp = logps[i, :end].tolist()
            samples.append(Sample(list(prompt), comp, lp, tok.decode(comp, skip_special_tokens=True)))
        return _regroup(samples, requests)


class VLLMGenerator:
    """TRL's own vLLM engine (use_vllm: colocate or server), through its public VLLMGeneration.generate on token ids:
    the prompts go as ids (no re-render), TRL syncs the policy weights into vLLM before each rollout, and vLLM's
    sampling log-probs (logprobs=0: the sampled token's) come back for TRL's importance-sampling correction."""

    def __init__(self, trainer: GRPOTrainer):
        self.trainer = trainer

    def __call__(self, requests: list[Request]) -> list[list[Sample]]:
        t = self.trainer
        rows = [list(r.prompt_ids) for r in requests for _ in range(r.n)]
        # one completion per row: colocate mode samples n=1 per prompt row, server mode takes every row as a prompt
        _, completion_ids, logprobs, _ = t.vllm_generation.generate(prompts=rows, images=None, num_generations=1)
        tok = t.processing_class
        samples = []
        for i, prompt in enumerate(rows):
            comp = list(completion_ids[i])
            lp = [float("nan") if x[0] is None else float(x[0]) for x in logprobs[i]] if logprobs else []
            samples.append(Sample(prompt, comp, lp, tok.decode(comp, skip_special_tokens=True)))
        return _regroup(samples, requests)


def _regroup(samples: list[Sample], requests: list[Request]) -> list[list[Sample]]:
    out, i = [], 0
    for r in requests:
        out.append(samples[i : i + r.n])
        i += r.n
    return out


class VLLMToolParser:
    """vLLM's own tool-call parser (the one `vllm serve --tool-call-parser NAME` uses; vLLM 0.31: vllm.tool_parsers
    ToolParserManager) on a whole generated text: (content, OpenAI tool_calls). GPU nodes only (vLLM installed);
    not run on CPU (docs/training.md, "Online GRPO")."""

    def __init__(self, name: str, tokenizer):
        try:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
            from vllm.tool_parsers import ToolParserManager
        except ImportError as e:
            raise ImportError(f"tool_call_parser {name!r} needs vLLM (make gpu-setup): {e}") from None
        self.cls, self.request, self.tok = ToolParserManager.get_tool_parser(name), ChatCompletionRequest, tokenizer

    def __call__(self, text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
        parser = self.cls(self.tok)  # a parser keeps streaming state: one per reply
        req = self.request(model="planner", messages=[{"role": "user", "content": ""}], tools=tools)
        info = parser.extract_tool_calls(text, req)
        if not info.tools_called:
            return info.content if info.content is not None else text, []
        calls = [
            {"type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in info.tool_calls
        ]
        return info.content, calls


class GenerationQueue:
    """Batches the planner calls of concurrent episodes: a call waits while other episodes can still reach theirs
    (one event-loop turn without a new request), then one generation serves them all."""

    def __init__(self, generate):
        self.generate = generate
        self.pending: list[tuple[Request, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.stats = {"generate_calls": 0, "samples": 0, "generated_tokens": 0}

    async def sample(self, request: Request) -> list[Sample]:
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((request, fut))
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())
        return await fut

    async def _flush(self) -> None:
        seen = -1
        while len(self.pending) != seen:  # let every runnable episode reach its next planner call
            seen = len(self.pending)
            await asyncio.sleep(0)
        batch, self.pending, self._flusher = self.pending, [], None
        try:
            results = self.generate([r for r, _ in batch])
        except BaseException as e:  # noqa: BLE001 - handed to every waiting episode (it raises there)
            for _, fut in batch:
                fut.set_exception(e)
            return
        self.stats["generate_calls"] += 1
        for (_, fut), res in zip(batch, results, strict=True):
            self.stats["samples"] += len(res)
            self.stats["generated_tokens"] += sum(len(s.completion_ids) for s in res)
            fut.set_result(res)


# ---- the planner backed by the policy -------------------------------------------------------------------------------


class PolicyPlanner:
    """The runtime's Planner (collect.roles.base.Planner) backed by the policy being trained: the prompt is the state's
    render for the policy (rl.train.render_prompt: template_messages + that task's tools), tokenised without special
    tokens; each call's Sample (ids, generated ids, log-probs) is kept in `calls`. A prompt that leaves no room for a
    completion in the model's context is the loop's context_length ChatError (the run ends budget_exhausted)."""

    def __init__(
        self,
        tokenizer,
        queue: GenerationQueue,
        *,
        chat_template_kwargs=None,
        context_length=None,
        name="",
        tool_parser=None,
    ):
        self.tok, self.queue, self.kwargs = tokenizer, queue, dict(chat_template_kwargs or {})
        self.context_length, self.name, self.tool_parser = context_length, name or "policy", tool_parser
        self.calls: list[Sample] = []

    def fork(self) -> PolicyPlanner:
        """A planner for another episode: the same policy, queue and parser, its own `calls`."""
        return PolicyPlanner(
            self.tok,
            self.queue,
            chat_template_kwargs=self.kwargs,
            context_length=self.context_length,
            name=self.name,
            tool_parser=self.tool_parser,
        )

    def reply(self, s: Sample, tools: list[dict]) -> PlannerReply:
        """What the runtime gets for a sample: its text (the runtime parses <tool_call>{json}</tool_call>), or, with a
        tool-call parser, the parser's content and tool calls, as a served model's reply arrives."""
        if self.tool_parser is None:
            return PlannerReply(text=s.text, tool_calls=[], usage=self.usage(s))
        content, calls = self.tool_parser(s.text, tools)
        return PlannerReply(text=content or "", tool_calls=calls, usage=self.usage(s))

    def completion(self, s: Sample, tools: list[dict]):
        """A sample as the reward functions read it: the text, or TRL's conversational form with the parsed calls."""
        if self.tool_parser is None:
            return s.text
        content, calls = self.tool_parser(s.text, tools)
        return [{"role": "assistant", "content": content or "", "tool_calls": calls}]

    def render(self, messages: list[dict], tools: list[dict]) -> list[int]:
        text = render_prompt(self.tok, messages, tools, self.kwargs)
        return self.tok(text, add_special_tokens=False)["input_ids"]

    async def sample(self, messages: list[dict], tools: list[dict], n: int, *, r0, ledger) -> list[Sample]:
        ids = self.render(messages, tools)
        if self.context_length is not None and len(ids) >= self.context_length:
            usage = Usage(model=self.name, prompt_tokens=len(ids))
            raise ChatError("context_length", f"prompt of {len(ids)} tokens >= context {self.context_length}", usage)
        ctx = {"messages": messages, "tools": tools, "r0": r0, "ledger": ledger}
        return await self.queue.sample(Request(ids, n, ctx))

    def usage(self, s: Sample) -> Usage:
        return Usage(
            model=self.name, calls=1, prompt_tokens=len(s.prompt_ids), completion_tokens=len(s.completion_ids)
        )

    async def decide(self, messages: list[dict], tools: list[dict], *, r0: TaskContext, ledger: Ledger):
        [s] = await self.sample(messages, tools, 1, r0=r0, ledger=ledger)
        self.calls.append(s)
        return self.reply(s, tools)


class CandidateFirst:
    """A fork's planner: its first call, at the anchor state, answers with the group's sampled candidate (the row TRL
    trains on; the prompt must be the anchor's, else the fork is not at its anchor and this raises); every later call
    is the policy's."""

    def __init__(self, candidate: Sample, anchor_messages: list[dict], policy: PolicyPlanner):
        self.candidate, self.anchor_messages, self.policy = candidate, anchor_messages, policy
        self.used = False

    async def decide(self, messages: list[dict], tools: list[dict], *, r0: TaskContext, ledger: Ledger):
        if self.used:
            return await self.policy.decide(messages, tools, r0=r0, ledger=ledger)
        if messages != self.anchor_messages:
            raise RuntimeError("a fork's first planner call is not at its anchor state")
        self.used = True
        return self.policy.reply(self.candidate, tools)


class CountingToolBox:
    """The task's ToolBox with a count of the tool calls executed through it (one per episode)."""

    def __init__(self, toolbox):
        self.toolbox, self.calls = toolbox, 0

    def schemas(self) -> list[dict]:
        return self.toolbox.schemas()

    def take_usage(self) -> dict:
        return self.toolbox.take_usage() if hasattr(self.toolbox, "take_usage") else {}

    async def execute(self, name: str, arguments: dict):
        self.calls += 1
        return await self.toolbox.execute(name, arguments)


# ---- rewards of one executed decision -------------------------------------------------------------------------------


def closed_reward(before: Ledger, after: Ledger) -> float:
    """What one executed decision closed in the ledger: 1 when it ended the task with an answer the gate and the
    answer critic accepted; else the share of what was open at the anchor (open needs, unresolved conflicts) that it
    closed (needs now filled, conflicts now resolved); 0 for a blocked finish, a rejected reply, a forced answer, a
    futile or failed call."""
    if before.outcome is None and after.outcome in ("accepted", "repaired"):
        return 1.0
    open_needs = [n.index for n in before.needs if n.open]
    open_conflicts = [c.id for c in before.conflicts if not c.resolved]
    total = len(open_needs) + len(open_conflicts)
    if not total:
        return 0.0
    filled = sum(1 for i in open_needs if i < len(after.needs) and after.needs[i].status == "filled")
    resolved = {c.id for c in after.conflicts if c.resolved}
    return (filled + sum(1 for c in open_conflicts if c in resolved)) / total


def group_advantages(totals: list[float | None], num_generations: int, scale_rewards: str) -> list[float]:
    """TRL 1.16's advantages of one rollout batch (GRPOTrainer._generate_and_score_completions, sum_then_normalize):
    reward minus its group's mean (NaN left out), divided by the group's (or the batch's) unbiased std + 1e-4 unless
    scale_rewards is none; an unscorable completion (None) gets 0. Logged beside the rewards; TRL computes its own."""
    from trl.trainer.utils import nanstd

    r = torch.tensor([float("nan") if x is None else float(x) for x in totals], dtype=torch.float32)
    grouped = r.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations)
    if scale_rewards == "batch":
        std = nanstd(r).expand_as(r) if r.numel() > 1 else torch.zeros_like(r)
    else:
        std = nanstd(grouped, dim=1).repeat_interleave(num_generations) if num_generations > 1 else torch.zeros_like(r)
    adv = r - mean
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0).tolist()


def weighted_total(components: dict[str, list], weights: dict[str, float]) -> list[float | None]:
    """TRL's weighted sum per completion: a None component adds nothing; every component None -> None."""
    n = len(next(iter(components.values())))
    out = []
    for i in range(n):
        kept = [(weights[k], v[i]) for k, v in components.items() if v[i] is not None and not math.isnan(v[i])]
        out.append(sum(w * x for w, x in kept) if kept else None)
    return out


async def decision_rewards(completions: list, columns: dict[str, list], names: tuple[str, ...]) -> dict[str, list]:
    """rl.train's reward functions (rewards.REWARD_FUNCS) on (anchor state, decision), in the rl_states columns."""
    out = {}
    for name in names:
        res = REWARD_FUNCS[name](completions, **columns)
        out[name] = await res if inspect.isawaitable(res) else res
    return out


# ---- the rollout ----------------------------------------------------------------------------------------------------


@dataclass
class World:
    """What the runtime needs for a task, from the collect recipe: the train tasks by id, tools, corpus, runtime,
    roles (the planner is replaced by the policy) and the answer judge's settings."""

    cfg: Any  # CollectConfig
    tasks: dict
    tools_cfg: ToolsConfig
    corpus: list
    runtime: RuntimeConfig


def load_world(script: OnlineScriptArguments) -> World:
    cfg = load_collect_config(script.collect, {"split": script.split, "limit": script.limit})
    runtime = cfg.runtime
    if script.runtime:
        runtime = from_mapping(RuntimeConfig, {**dataclasses.asdict(runtime), **script.runtime}, "runtime")
    tasks = load_task_list(cfg)
    held = [t.id for t in tasks if t.split in EVAL_SPLITS]
    if held:
        raise OnlineRunError(
            f"{script.collect}: the selection holds {len(held)} evaluation-split task(s) (e.g. {held[:3]}); online "
            "GRPO trains only on train tasks"
        )
    tools_cfg = from_mapping(ToolsConfig, cfg.tools, "tools")
    return World(cfg, {t.id: t for t in tasks}, tools_cfg, load_task_corpus(cfg), runtime)


class LedgerRollout:
    """TRL's rollout_func for the ledger runtime (module docstring): `rollout(prompts, trainer)` -> exactly
    len(prompts) rows. `generator`: Request list -> Sample lists (default: the trainer's vLLM engine when use_vllm,
    else its model); `weights`: by name (online_weights); the group lines go to `log_path` when set."""

    def __init__(
        self,
        world: World,
        weights: dict[str, float],
        *,
        anchor_step: int | None = None,
        seed: int = 0,
        chat_template_kwargs: dict | None = None,
        generator=None,
        log_path: str | os.PathLike | None = None,
        model_name: str = "policy",
        tool_call_parser: str | None = None,
        keep_episodes: bool = False,
    ):
        self.world, self.weights, self.anchor_step, self.seed = world, dict(weights), anchor_step, seed
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.generator, self.log_path, self.model_name = generator, log_path, model_name
        self.tool_call_parser = tool_call_parser
        self.keep_episodes = keep_episodes  # the scout's and the forks' trajectory records in `episodes` (tests)
        self.episodes: list[dict] = []
        self.names = tuple(n for n in ONLINE_REWARDS if not (n in SKIPPED_WHEN_UNWEIGHTED and self.weights[n] == 0))
        self.totals = {"groups": 0, "episodes": 0, "tool_calls": 0, "planner_calls": 0, "rollout_s": 0.0}
        self.totals |= {"scout_correct": 0, "fork_correct": 0, "forks": 0}
        self.groups: list[dict] = []  # this process's group lines (also appended to log_path)

    def __call__(self, prompts: list, trainer: GRPOTrainer) -> dict[str, list]:
        g = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        t0 = time.time()
        out = asyncio.run(self.rollout(prompts, trainer, g))
        self.totals["rollout_s"] += time.time() - t0
        return out

    async def rollout(self, prompts: list, trainer, g: int) -> dict[str, list]:
        if len(prompts) % g:
            raise ValueError(f"rollout: {len(prompts)} prompts is not a whole number of groups of {g}")
        keys = [_task_key(p) for p in prompts]
        groups = [keys[i : i + g] for i in range(0, len(keys), g)]
        for grp in groups:
            if len(set(grp)) != 1:
                raise ValueError(f"rollout: a group of {g} prompts holds several tasks {sorted(set(grp))}")
        generate = self.generator or (
            VLLMGenerator(trainer) if trainer.args.use_vllm else TransformersGenerator(trainer)
        )
        tok = trainer.processing_class
        ctx_len = _context_length(trainer)
        parser = VLLMToolParser(self.tool_call_parser, tok) if self.tool_call_parser else None
        policy = PolicyPlanner(
            tok, GenerationQueue(generate), chat_template_kwargs=self.chat_template_kwargs, context_length=ctx_len,
            name=self.model_name, tool_parser=parser,
        )  # fmt: skip
        step = trainer.state.global_step
        pool = ClientPool(self.world.cfg.endpoints, concurrency=self.world.runtime.concurrency)
        try:
            results = await asyncio.gather(
                *(self.group(grp[0], g, policy, pool, step, i) for i, grp in enumerate(groups))
            )
        finally:
            await pool.close()
        totals = [x for res in results for x in weighted_total(res["rewards"], self.weights)]
        advantages = group_advantages(totals, g, trainer.args.scale_rewards)
        lines = []
        for i, res in enumerate(results):
            line = res["line"] | {
                "rewards": {k: [_round(v) for v in vals] for k, vals in res["rewards"].items()},
                "total": [_round(v) for v in totals[i * g : (i + 1) * g]],
                "advantages": [round(a, 6) for a in advantages[i * g : (i + 1) * g]],
            }
            lines.append(line)
        self._write(lines, trainer)
        rows: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        rows |= {f"reward_{n}": [] for n in ONLINE_REWARDS}
        for res in results:
            for j, s in enumerate(res["samples"]):
                rows["prompt_ids"].append(list(s.prompt_ids))
                rows["completion_ids"].append(list(s.completion_ids))
                rows["logprobs"].append(list(s.logprobs))
                for n in ONLINE_REWARDS:
                    vals = res["rewards"].get(n)
                    rows[f"reward_{n}"].append(None if vals is None else vals[j])
        return rows

    async def group(self, task_id: str, g: int, policy: PolicyPlanner, pool, step: int, index: int) -> dict:
        """One group: scout episode, anchor, G samples, G executed forks; rewards per component."""
        w = self.world
        task = w.tasks.get(task_id)
        if task is None:
            raise KeyError(f"rollout: task {task_id!r} is not among the {len(w.tasks)} train tasks of {w.cfg.tasks}")
        t0 = time.time()
        r0 = task.to_context()
        toolbox = ToolBox(task, r0, w.tools_cfg, corpus=w.corpus)
        roles = build_roles(task, w.cfg.roles, w.cfg.endpoints, pool)
        scout_planner = policy.fork()
        scout_tools = CountingToolBox(toolbox)
        run = await loop.start_run(r0, dataclasses.replace(roles, planner=scout_planner), scout_tools, w.runtime)
        states = []  # the decision states the scout reached, in order
        while not run.ledger.done:
            state = run.fork() if loop.stop_before_decide(run) is None else None
            n_steps = len(run.steps)
            await loop.step(run, scout_tools)
            if state is not None and len(run.steps) > n_steps:  # the planner was asked here (not over context)
                states.append(state)
        scout = loop.record(run, str(task.answer))
        scout_correct, _ = await judge_answer(w.cfg, task, engine_answer(scout), pool)
        if not states:  # the runtime stopped before any decision (e.g. nothing could advance): anchor at S_0
            states = [await loop.start_run(r0, roles, scout_tools, w.runtime)]
        rng = random.Random(f"{self.seed}:{step}:{index}:{task_id}")
        k = rng.randrange(len(states)) if self.anchor_step is None else min(self.anchor_step, len(states) - 1)
        anchor = states[k]
        messages = anchor.arm.messages(anchor.ledger, anchor.latest)  # what the runtime's _decide renders there
        samples = await policy.sample(messages, anchor.tools, g, r0=anchor.r0, ledger=anchor.ledger)
        forks = await asyncio.gather(
            *(self.fork(task, anchor, messages, s, roles, policy, toolbox, pool) for s in samples)
        )

        refs = offered_refs(messages)
        offered = [t["function"]["name"] for t in anchor.tools]
        reference = TeacherPlanner().choose(anchor.r0, anchor.ledger, offered, refs).to_dict()
        columns = {
            "prompts": [messages] * g,
            "tools": [json.dumps(anchor.tools, ensure_ascii=False)] * g,
            "ledger": [json.dumps(anchor.ledger.to_dict(), ensure_ascii=False)] * g,
            "digest": [json.dumps(digest(anchor.r0, anchor.ledger), ensure_ascii=False)] * g,
            "question": [task.question] * g,
            "gold_answer": [str(task.answer)] * g,
            "reference_action": [json.dumps(reference, ensure_ascii=False)] * g,
        }
        completions = [policy.completion(s, anchor.tools) for s in samples]
        rewards = await decision_rewards(completions, columns, tuple(n for n in self.names if n in DECISION_REWARDS))
        rewards["closed"] = [f["closed"] for f in forks]
        rewards["outcome"] = [None if f["correct"] is None else float(f["correct"]) for f in forks]
        rewards = {n: rewards[n] for n in self.names}

        tool_calls = scout_tools.calls + sum(f["tool_calls"] for f in forks)
        planner_calls = len(scout_planner.calls) + sum(f["planner_calls"] for f in forks)
        self.totals["groups"] += 1
        self.totals["episodes"] += 1 + g
        self.totals["tool_calls"] += tool_calls
        self.totals["planner_calls"] += planner_calls
        self.totals["scout_correct"] += bool(scout_correct)
        self.totals["fork_correct"] += sum(bool(f["correct"]) for f in forks)
        self.totals["forks"] += g
        line = {
            "step": step,
            "group": index,
            "task_id": task_id,
            "anchor": {
                "k": k,
                "states_reached": len(states),
                "t": anchor.ledger.steps,
                "ledger_hash": state_hash(anchor.ledger),
                "prompt_tokens": len(samples[0].prompt_ids),
                "reference_action": reference,
            },
            "scout": {
                "outcome": scout["outcome"],
                "answer": engine_answer(scout),
                "correct": scout_correct,
                "steps": len(scout["steps"]),
                "tool_calls": scout_tools.calls,
            },
            "candidates": [
                {
                    "text": s.text[:300],
                    "completion_tokens": len(s.completion_ids),
                    "executed": f["executed"],
                    "candidate_tool_calls": f["candidate_tool_calls"],
                    "outcome": f["outcome"],
                    "answer": f["answer"],
                    "correct": f["correct"],
                    "steps": f["steps"],
                    "tool_calls": f["tool_calls"],
                }
                for s, f in zip(samples, forks, strict=True)
            ],
            "episodes": 1 + g,
            "tool_calls": tool_calls,
            "planner_calls": planner_calls,
            "wall_s": round(time.time() - t0, 3),
        }
        if self.keep_episodes:
            self.episodes.append(
                {"step": step, "task_id": task_id, "k": k, "scout": scout, "forks": [f["record"] for f in forks]}
            )
        return {"samples": samples, "rewards": rewards, "line": line}

    async def fork(self, task, anchor: loop.Run, messages, candidate: Sample, roles, policy, toolbox, pool) -> dict:
        """Execute one candidate in its own fork of the anchor state, then let the policy finish the episode."""
        planner = policy.fork()
        tools = CountingToolBox(toolbox)
        first = CandidateFirst(candidate, messages, planner)
        run = anchor.fork(dataclasses.replace(roles, planner=first))
        before = run.ledger
        n_steps = len(run.steps)
        await loop.step(run, tools)  # the candidate: tool -> critic -> reducer, or finish -> gate -> finalizer
        events = run.steps[-1]["events"] if len(run.steps) > n_steps else run.final_events
        executed = [e.get("kind") for e in events]
        candidate_calls = tools.calls
        closed = closed_reward(before, run.ledger)
        while not run.ledger.done:
            await loop.step(run, tools)
        rec = loop.record(run, str(task.answer))
        answer = engine_answer(rec)
        correct, _ = await judge_answer(self.world.cfg, task, answer, pool)
        return {
            "executed": executed,
            "candidate_tool_calls": candidate_calls,
            "closed": closed,
            "outcome": rec["outcome"],
            "answer": answer,
            "correct": correct,
            "steps": len(rec["steps"]),
            "tool_calls": tools.calls,
            "planner_calls": len(planner.calls) + int(first.used),
            "record": rec,
        }

    def _write(self, lines: list[dict], trainer) -> None:
        self.groups += lines
        if self.log_path is None or not trainer.accelerator.is_main_process:
            return
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.writelines(jsonio.dumps(x, nonfinite="string", ensure_ascii=False) + "\n" for x in lines)
        for x in lines:
            log.info(
                "step %d task %s: anchor t=%d of %d, total %s, scout %s, forks correct %d/%d, %d tool calls",
                x["step"], x["task_id"], x["anchor"]["t"], x["anchor"]["states_reached"], x["total"],
                x["scout"]["outcome"], sum(bool(c["correct"]) for c in x["candidates"]), len(x["candidates"]),
                x["tool_calls"],
            )  # fmt: skip


def _task_key(prompt) -> str:
    """The task id a dataset prompt carries (a string; a chat prompt's last message content)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content"))
    raise TypeError(f"rollout: a prompt must carry a task id, got {type(prompt).__name__}")


def _context_length(trainer) -> int | None:
    """Prompt tokens the policy can take with max_completion_length left for the reply (None when unknown)."""
    cfg = trainer.accelerator.unwrap_model(trainer.model).config
    try:
        cfg = cfg.get_text_config()
    except (AttributeError, TypeError):
        pass
    n = getattr(cfg, "max_position_embeddings", None)
    return n - trainer.args.max_completion_length if isinstance(n, int) and n > 0 else None


def _round(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(float(v), 6)


def trainer_reward_funcs(weights: dict[str, float]) -> list:
    """One TRL reward function per ONLINE_REWARDS name, returning the rollout's `reward_<name>` column (computed
    where the episodes ran); TRL logs each as rewards/<name>/mean. An unweighted skipped one returns None."""

    def make(name: str):
        def reward(completions: list, **kwargs) -> list[float | None]:
            vals = kwargs.get(f"reward_{name}")
            if vals is None:
                raise KeyError(f"reward {name}: the rollout returned no reward_{name} column (is rollout_func set?)")
            return list(vals)

        reward.__name__ = reward.__qualname__ = name
        return reward

    return [make(n) for n in ONLINE_REWARDS]


# ---- the stage ------------------------------------------------------------------------------------------------------


def recipe_hash(recipe: RLRecipe) -> str:
    """What makes two runs the same run (resume): the stage options, the model options and the GRPO settings, not
    where they are written, how long they run nor how they are reported."""
    volatile = {"output_dir", "logging_dir", "max_steps", "report_to", "disable_tqdm", "run_name", "logging_steps"}
    grpo = {k: v for k, v in recipe.training.to_dict().items() if k not in volatile and not k.startswith("hub_")}
    script = {k: v for k, v in asdict(recipe.script).items() if k != "overwrite"}
    blob = json.dumps([script, asdict(recipe.model), grpo], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def prepare_out(recipe: RLRecipe) -> Path:
    """OUT for this recipe, created; OUT of another recipe is refused unless overwrite (which empties it of this
    stage's files and checkpoints)."""
    out = Path(recipe.training.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta, h = out / RUN_META, recipe_hash(recipe)
    if recipe.script.overwrite:
        for p in (out / GROUPS_LOG, out / SUMMARY, meta):
            p.unlink(missing_ok=True)
        for ckpt in out.glob("checkpoint-*"):
            shutil.rmtree(ckpt)
    elif meta.exists():
        old = json.loads(meta.read_text(encoding="utf-8")).get("recipe_hash")
        if old != h:
            raise OnlineRunError(
                f"{out} holds an online run of another recipe (recipe_hash {old} != {h}); use another --output_dir "
                "or --overwrite true"
            )
    jsonio.write_json(meta, {"recipe_hash": h}, default=str)
    return out


def checkpoint_step(ckpt: str | os.PathLike) -> int:
    return int(json.loads((Path(ckpt) / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


def resume_point(out: Path) -> str | None:
    """The last Trainer checkpoint in OUT (None: start afresh); the group log keeps the lines of the steps before
    it (the steps after it run again) and is emptied when there is none."""
    last = get_last_checkpoint(str(out)) if any(out.glob("checkpoint-*")) else None
    groups = out / GROUPS_LOG
    if last is None:
        groups.write_text("")
    elif groups.exists():
        done = checkpoint_step(last)
        keep = [x for x in groups.read_text(encoding="utf-8").splitlines() if x and json.loads(x)["step"] < done]
        groups.write_text("".join(x + "\n" for x in keep))
    return last


def build_trainer(recipe: RLRecipe, *, generator=None) -> tuple[GRPOTrainer, LedgerRollout, Any, str, World]:
    """Train tasks, policy, rollout and GRPOTrainer for one online recipe. `generator`: see LedgerRollout (tests)."""
    script, training, model_args = recipe
    world = load_world(script)
    ds = Dataset.from_list([{"prompt": tid} for tid in world.tasks])  # the prompt carries the task key
    model, tok, peft_config, how = load_policy(model_args)
    judge = use_judge(build_judge(script.judge))
    use_execution_check(ExecutionCheck())
    weights = online_weights(training.reward_weights)
    rollout = LedgerRollout(
        world,
        weights,
        anchor_step=script.anchor_step,
        seed=training.seed,
        chat_template_kwargs=training.chat_template_kwargs,
        generator=generator,
        log_path=Path(training.output_dir) / GROUPS_LOG,
        model_name=Path(model_args.model_name_or_path).name,
        tool_call_parser=script.tool_call_parser,
    )
    trainer = build_grpo_trainer(
        GRPOTrainer,
        model,
        model_args,
        how,
        reward_funcs=trainer_reward_funcs(weights),
        args=training,
        train_dataset=ds,
        processing_class=tok,
        peft_config=peft_config,
        rollout_func=rollout,
    )
    log.info(
        "%d train tasks from %s; policy %s (%s); G=%d, %d groups per rollout",
        len(ds), script.collect, model_args.model_name_or_path, how, training.num_generations,
        training.generation_batch_size // training.num_generations,
    )  # fmt: skip
    return trainer, rollout, judge, how, world


def group_means(lines: list[dict]) -> dict[str, dict]:
    """Per reward component: the mean over every completion of every group, and over the first and last quarter of
    the groups (the trend)."""
    out = {}
    for name in [*ONLINE_REWARDS, "total"]:
        per = [
            [v for v in (x["total"] if name == "total" else x["rewards"].get(name) or []) if v is not None]
            for x in lines
        ]
        flat = [v for p in per for v in p]
        if not flat:
            continue
        q = max(1, len(per) // 4)
        first = [v for p in per[:q] for v in p]
        last = [v for p in per[-q:] for v in p]
        out[name] = {
            "mean": sum(flat) / len(flat),
            "first_quarter_mean": sum(first) / len(first) if first else None,
            "last_quarter_mean": sum(last) / len(last) if last else None,
        }
    return out


def summarize(state, totals: dict, recipe: RLRecipe, how: str, judge_stats: dict, world: World, wall: float) -> dict:
    """rl.train's summary of the trainer state (per-component reward means from TRL's log, KL, loss), plus the
    online run's figures from OUT's group log: groups, episodes, tool calls, the scout episodes' accuracy (first and
    last quarter: whether the planner itself improves), per-component means over the groups."""
    out = Path(recipe.training.output_dir)
    lines = [json.loads(x) for x in (out / GROUPS_LOG).read_text(encoding="utf-8").splitlines() if x]
    summary = summarize_training(
        SimpleNamespace(state=state), wall, recipe, how, judge_stats, len(world.tasks), weights=online_weights,
        trained_task_ids=sorted(world.tasks),
    )  # fmt: skip
    scouts = [x["scout"]["correct"] for x in lines]
    q = max(1, len(scouts) // 4)
    episodes_here = totals.get("episodes", 0)  # this process's run (a resumed run counts from its checkpoint on)
    summary["online"] = {
        "groups": len(lines),
        "episodes": sum(x["episodes"] for x in lines),
        "tool_calls": sum(x["tool_calls"] for x in lines),
        "planner_calls": sum(x["planner_calls"] for x in lines),
        "episodes_per_hour": round(episodes_here / wall * 3600, 1) if wall > 0 else None,
        "rollout_share_of_wall": round(totals.get("rollout_s", 0.0) / wall, 3) if wall > 0 else None,
        "scout_accuracy": sum(bool(s) for s in scouts) / len(scouts) if scouts else None,
        "scout_accuracy_first_quarter": sum(bool(s) for s in scouts[:q]) / q if scouts else None,
        "scout_accuracy_last_quarter": sum(bool(s) for s in scouts[-q:]) / q if scouts else None,
        "component_means": group_means(lines),
        "anchor_steps": sorted({x["anchor"]["t"] for x in lines}),
        "generator": "vllm" if recipe.training.use_vllm else "transformers",
    }
    summary["config"] = {
        "script": asdict(recipe.script),
        "model": asdict(recipe.model),
        "grpo": recipe.training.to_dict(),
    }
    summary["recipe_hash"] = recipe_hash(recipe)
    return summary


CHECKPOINT_ONLY = ("optimizer.pt", "scheduler.pt", "trainer_state.json")  # + rng_state*.pth: not the policy


def finished_summary(out: Path, recipe: RLRecipe) -> dict | None:
    """OUT's summary when it is this recipe's and covers max_steps (nothing left to do), else None."""
    path = out / SUMMARY
    if not path.exists():
        return None
    summary = json.loads(path.read_text(encoding="utf-8"))
    if summary.get("recipe_hash") == recipe_hash(recipe) and summary.get("steps", 0) >= recipe.training.max_steps:
        return summary
    return None


def train(recipe: RLRecipe, *, generator=None) -> tuple[GRPOTrainer | None, dict]:
    """Run, resume or find finished one online recipe: (the trainer, or None when it did not train, the summary).
    A run stopped after its final checkpoint but before its outputs gets them from that checkpoint."""
    out = prepare_out(recipe)
    if (summary := finished_summary(out, recipe)) is not None:
        log.info("%s: already finished (%d steps); nothing to do", out, summary["steps"])
        return None, summary
    last = resume_point(out)
    if last is not None and checkpoint_step(last) >= recipe.training.max_steps:
        return None, finish_from_checkpoint(recipe, out, last)
    trainer, rollout, judge, how, world = build_trainer(recipe, generator=generator)
    t0 = time.time()
    trainer.train(resume_from_checkpoint=last)
    wall = time.time() - t0
    save_policy(trainer, trainer.processing_class, out)
    summary = summarize(trainer.state, rollout.totals, recipe, how, dict(judge.stats), world, wall)
    summary["resumed_from"] = last
    if trainer.accelerator.is_main_process:
        jsonio.write_json(out / SUMMARY, summary, default=str)
        o = summary["online"]
        log.info(
            "done: %d steps in %.1fs, %d groups, %d episodes (%.0f/h), %d tool calls; component means %s",
            summary["steps"], wall, o["groups"], o["episodes"], o["episodes_per_hour"] or 0, o["tool_calls"],
            {k: round(v["mean"], 3) for k, v in o["component_means"].items()},
        )  # fmt: skip
    return trainer, summary


def finish_from_checkpoint(recipe: RLRecipe, out: Path, ckpt: str) -> dict:
    """The outputs of a run whose final checkpoint is on disk: its policy files copied to OUT, the summary from its
    trainer state and the group log (wall time and rollout counters of the stopped process are unknown: 0)."""
    from transformers import TrainerState

    for f in Path(ckpt).iterdir():
        if f.is_file() and f.name not in CHECKPOINT_ONLY and not f.name.startswith("rng_state"):
            shutil.copy2(f, out / f.name)
    state = TrainerState.load_from_json(str(Path(ckpt) / "trainer_state.json"))
    world = load_world(recipe.script)
    summary = summarize(state, {}, recipe, reference_policy(recipe.model), {}, world, 0.0)
    summary["resumed_from"] = summary["finished_from_checkpoint"] = ckpt
    jsonio.write_json(out / SUMMARY, summary, default=str)
    log.info("%s: the final checkpoint %s was on disk; outputs written from it", out, ckpt)
    return summary


def main(argv: list[str] | None = None) -> dict:
    setup_logging()
    _, summary = train(parse_args(argv if argv is not None else sys.argv[1:]))
    return summary


if __name__ == "__main__":
    run_cli(
        main,
        "training stopped; rerun the same command to resume from OUT's last checkpoint",
        errors=(FileNotFoundError, OnlineRunError),
    )
