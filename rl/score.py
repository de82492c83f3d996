"""Score a policy on held-out ledger states: one greedy decision per state, rewarded like RL (before/after numbers).

    python -m rl.score --dataset_dir DATA/rl_states --model M [--split eval] [--n 64] [--config configs/rl/tiny.yaml]
    python -m rl.score --dataset_dir DATA/rl_states --sensitivity [--split train] [--n 300]   # no model: the reward
    python -m rl.score --dataset_dir DATA/rl_states --model M --samples K [--split train]   # what a GRPO group sees
    python -m rl.score ... --reference_tools code_executor   # only the states whose teacher decision is a program

`--sensitivity` asks whether the reward can tell a right decision from a near miss at all (no policy involved): the
recorded (teacher) action of each state with a query argument, the same call with the query of another state, and
the same call with the query's first three words dropped, each scored like an RL completion.

`--samples K` asks whether GRPO can find the teacher's decision at all: K samples per state at the recipe's
temperature, as in a group, and how often one of them has the teacher's query (see `group_reach`).

Prints (and returns) the mean weighted total and each component (valid, gate, target, align, and compute: on the
states whose reference is a program, the share whose greedy program prints the reference's value, computed whatever
its weight); judged components skip failed judge calls (None), as in training. The judge, weights, chat-template
kwargs, model dtype and decision length come from --config (parsed by rl.train.parse_args like training), else from
the defaults there: the offline judge, the paper weights and TRL's GRPOConfig/ModelConfig defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics

import torch
from datasets import load_from_disk

from collect import jsonio
from collect.actions import Action
from collect.cli import run_cli
from collect.ledger import call_signature, canonical_args
from rewards import build_judge, score_components, total, use_judge
from rewards.rules import parse_candidate
from rl.train import (
    STATE_KEY,
    load_config,
    load_policy,
    named_weights,
    render_prompts,
    scored_state_files,
    states_calling,
)

log = logging.getLogger("rl.score")


def _mean(xs: list) -> float | None:
    kept = [x for x in xs if x is not None]
    return sum(kept) / len(kept) if kept else None


def reference_matches(completions: list[str], reference_actions: list[str]) -> dict:
    """How close the decisions are to the recorded (teacher) actions: the same tool; the same call, arguments
    included (canonical JSON); and, on states whose teacher call has a `query` (built from the need's query_focus),
    the same query string. An unparseable decision matches nothing."""

    def sig(name: str, args: dict | None) -> str:
        return call_signature(name, canonical_args(args or {}))

    pairs = [(parse_candidate(c), json.loads(r)) for c, r in zip(completions, reference_actions, strict=True)]
    with_query = [(a, r) for a, r in pairs if isinstance((r.get("arguments") or {}).get("query"), str)]
    return {
        "reference_tool_match": _mean([float(a is not None and a.name == r["name"]) for a, r in pairs]),
        "reference_action_match": _mean(
            [float(a is not None and sig(a.name, a.arguments) == sig(r["name"], r.get("arguments"))) for a, r in pairs]
        ),
        "reference_query_match": _mean(
            [float(a is not None and a.arguments.get("query") == r["arguments"]["query"]) for a, r in with_query]
        ),
        "n_with_query": len(with_query),
    }


def _load_split(dataset_dir: str, split: str):
    dd = load_from_disk(dataset_dir)
    if split not in dd:
        raise ValueError(f"{dataset_dir}: no split {split!r} (has {list(dd)})")
    return dd[split]


def _rewards(completions: list[str], ds, training, prompts: list[str]) -> tuple[dict, dict]:
    """Every reward component of `completions` (aligned with the states `ds`, whose rendered prompts are `prompts`,
    passed as GRPO passes them), and the means: weighted total first."""

    columns = {k: ds[k] for k in ds.column_names if k != "prompt"} | {"prompts": list(prompts)}
    comps = asyncio.run(score_components(completions, columns))
    means = {"total": _mean(total(comps, named_weights(training.reward_weights)))}
    return comps, means | {k: _mean(v) for k, v in comps.items()}


def _decode(policy, tok, texts: list[str], max_new: int, batch_size: int, k: int = 1, temperature: float = 1.0):
    """Decisions for `texts`: greedy (k=1), or k samples per prompt at `temperature` as GRPO draws a group (then the
    list holds each prompt's k samples in a row). Decoded like GRPO does (skip_special_tokens=True: the tool-call
    tags are ordinary added tokens)."""

    gen = {"do_sample": False} if k == 1 else {"do_sample": True, "temperature": temperature, "top_k": 0}
    completions: list[str] = []
    tok.padding_side = "left"
    step = max(1, batch_size // k)
    for i in range(0, len(texts), step):
        enc = tok(texts[i : i + step], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {key: v.to(policy.device) for key, v in enc.items()}
        with torch.no_grad():
            out = policy.generate(
                **enc, max_new_tokens=max_new, num_return_sequences=k, pad_token_id=tok.pad_token_id, **gen
            )
        completions += tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return completions


def select_states(
    ds,
    n: int,
    scored: str | None = None,
    which: str = "in",
    shuffle: int | None = None,
    reference_tools: str | None = None,
):
    """The states to score: with `reference_tools` (comma-separated tool names), only the states whose reference
    decision calls one of them (rl.train.states_calling, as GRPO's `reference_tools`: e.g. the program states); with
    `scored` (an rl.train output directory), only the states its GRPO run drew a group for (`which="in"`) or only the
    others (`"out"`), matched by rl.train.STATE_KEY; with `shuffle` (a seed), n drawn at random instead of the first n
    (a pool lists the teacher's states before the student's)."""

    if which not in ("in", "out"):
        raise ValueError(f"which must be 'in' or 'out', got {which!r}")
    if reference_tools:
        ds = states_calling(ds, reference_tools)
    if scored:
        lines = [json.loads(x) for f in scored_state_files(scored) for x in f.read_text().splitlines() if x.strip()]
        keys = {tuple(str(x[k]) for k in STATE_KEY) for x in lines}
        missing = [k for k in STATE_KEY if k not in ds.column_names]
        if missing:
            raise ValueError(f"these states have no {missing} columns to match {scored}'s scored states by")
        rows = zip(*(ds[k] for k in STATE_KEY), strict=True)
        idx = [i for i, r in enumerate(rows) if (tuple(map(str, r)) in keys) == (which == "in")]
        if not idx:
            where = "among" if which == "in" else "outside"
            raise ValueError(f"no state of this split is {where} {scored}'s scored states")
        ds = ds.select(idx)
    if shuffle is not None:
        ds = ds.shuffle(seed=shuffle)
    return ds.select(range(min(n, len(ds))))


def _policy_and_states(
    dataset_dir: str,
    model: str,
    split: str,
    n: int,
    config: str | None,
    scored: str | None = None,
    which: str = "in",
    shuffle: int | None = None,
    reference_tools: str | None = None,
):

    # without --config: TRL's defaults (GRPOConfig, ModelConfig), the offline judge and the paper weights
    script, training, model_args = load_config(config, {"dataset_dir": dataset_dir, "model_name_or_path": model})
    ds = select_states(_load_split(dataset_dir, split), n, scored, which, shuffle, reference_tools)
    policy, tok, _, _ = load_policy(model_args)
    policy.eval()
    texts = render_prompts(ds, tok, training.chat_template_kwargs)["prompt"]
    use_judge(build_judge(script.judge))
    return ds, training, policy, tok, texts


def score(
    dataset_dir: str,
    model: str,
    split: str = "eval",
    n: int = 64,
    config: str | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
    scored: str | None = None,
    which: str = "in",
    shuffle: int | None = None,
    reference_tools: str | None = None,
) -> dict:
    """Greedy-decode one decision for each of the first n states of `split` (select_states: optionally only those a
    GRPO run scored, or only the others, or n at random) and average every reward component."""
    ds, training, policy, tok, texts = _policy_and_states(
        dataset_dir, model, split, n, config, scored, which, shuffle, reference_tools
    )
    completions = _decode(policy, tok, texts, max_new_tokens or training.max_completion_length, batch_size)
    comps, means = _rewards(completions, ds, training, texts)
    matches = reference_matches(completions, ds["reference_action"])
    result = {
        "model": model,
        "split": split,
        **({"scored": scored, "which": which} if scored else {}),
        **({"shuffle": shuffle} if shuffle is not None else {}),
        **({"reference_tools": reference_tools} if reference_tools else {}),
        "n": len(completions),
        **means,
        "judge_skipped": sum(v is None for v in comps["target"]),
        **matches,  # same tool / same call / same query as the recorded (teacher) action
    }
    return result


def group_reach(
    dataset_dir: str,
    model: str,
    k: int,
    split: str = "eval",
    n: int = 64,
    config: str | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 16,
    seed: int = 0,
    scored: str | None = None,
    which: str = "in",
    shuffle: int | None = None,
    reference_tools: str | None = None,
) -> dict:
    """What a GRPO group sees: k samples per state at the recipe's temperature, rewarded like RL. Reports how often
    the group holds the recorded (teacher) query / call at all (`any_query_match`: the states GRPO can pull towards
    it), the per-sample match rates, how often the group's best-rewarded sample is the teacher's query when one is
    there (ties count), the GRPO advantage such a sample gets ((reward - group mean) / group std), and the groups
    whose k rewards are all equal (no advantage, no gradient), and how much of the advantage comes from groups whose
    rewards barely differ (`group_spread`). Sampling is seeded (`seed`)."""

    if k < 2:
        raise ValueError(f"group_reach needs k >= 2 samples per state, got {k}")
    ds, training, policy, tok, texts = _policy_and_states(
        dataset_dir, model, split, n, config, scored, which, shuffle, reference_tools
    )
    torch.manual_seed(seed)
    completions = _decode(
        policy, tok, texts, max_new_tokens or training.max_completion_length, batch_size, k, training.temperature
    )
    expanded = ds.select([i for i in range(len(ds)) for _ in range(k)])  # each state once per sample, in order
    refs = expanded["reference_action"]
    comps, means = _rewards(completions, expanded, training, [t for t in texts for _ in range(k)])
    totals = [0.0 if t is None else t for t in total(comps, named_weights(training.reward_weights))]
    per_sample = [reference_matches([c], [r]) for c, r in zip(completions, refs, strict=True)]
    groups = [range(i * k, (i + 1) * k) for i in range(len(ds))]
    query_groups = [g for g in groups if per_sample[g[0]]["n_with_query"]]
    hit = [any(per_sample[j]["reference_query_match"] for j in g) for g in query_groups]
    best_is_ref, advantage = [], []
    for g in (g for g, h in zip(query_groups, hit, strict=True) if h):
        top = max(totals[j] for j in g)
        best_is_ref.append(any(totals[j] == top and per_sample[j]["reference_query_match"] for j in g))
        mean, std = statistics.fmean(totals[j] for j in g), statistics.pstdev(totals[j] for j in g)
        advantage += [(totals[j] - mean) / std if std else 0.0 for j in g if per_sample[j]["reference_query_match"]]
    return {
        "model": model,
        "split": split,
        "n": len(ds),
        **({"reference_tools": reference_tools} if reference_tools else {}),
        "k": k,
        "temperature": training.temperature,
        **{f"sample_{key}": v for key, v in means.items()},
        "sample_tool_match": _mean([m["reference_tool_match"] for m in per_sample]),
        "sample_query_match": _mean([per_sample[j]["reference_query_match"] for g in query_groups for j in g]),
        "n_with_query": len(query_groups),
        "any_query_match": _mean([float(h) for h in hit]),
        "any_action_match": _mean([float(any(per_sample[j]["reference_action_match"] for j in g)) for g in groups]),
        "best_sample_is_teacher_query": _mean([float(b) for b in best_is_ref]),
        "teacher_query_advantage": _mean(advantage),
        "zero_std_groups": _mean([float(len({totals[j] for j in g}) == 1) for g in groups]),
        **group_spread(totals, k),
    }


def group_spread(totals: list[float], k: int, margin: float = 0.05) -> dict:
    """How GRPO's advantages are spread over groups of k consecutive rewards. `near_tie_groups`: the share of groups
    whose rewards differ by less than `margin` (but differ); `near_tie_advantage_share`: the share of the total
    |advantage| mass that such groups carry when advantages are (r - group mean) / group std (TRL's default
    scale_rewards="group"), and `near_tie_centered_share` the same with (r - group mean) only (scale_rewards="none").
    Dividing by the group's std gives a group whose rewards differ by 0.001 the same weight as one whose rewards
    differ by 1, so a high first share with a low second one says most of the gradient comes from reward noise."""

    if k < 2 or len(totals) % k:
        raise ValueError(f"group_spread needs groups of k >= 2 rewards, got {len(totals)} rewards and k={k}")
    groups = [totals[i : i + k] for i in range(0, len(totals), k)]
    ranges = [max(g) - min(g) for g in groups]
    near = [0 < r < margin for r in ranges]
    scaled, centered = [], []
    for g in groups:
        mean, std = statistics.fmean(g), statistics.pstdev(g)
        centered.append(sum(abs(x - mean) for x in g))
        scaled.append(sum(abs(x - mean) / (std + 1e-4) for x in g))  # TRL's epsilon

    def share(mass: list[float]) -> float | None:
        return sum(m for m, n in zip(mass, near, strict=True) if n) / sum(mass) if sum(mass) else None

    varied = [r for r in ranges if r > 0]
    return {
        "near_tie_margin": margin,
        "near_tie_groups": sum(near) / len(groups) if groups else None,
        "median_varied_reward_range": statistics.median(varied) if varied else None,
        "near_tie_advantage_share": share(scaled),
        "near_tie_centered_share": share(centered),
    }


def reward_sensitivity(dataset_dir: str, split: str = "train", n: int = 300, config: str | None = None) -> dict:
    """Mean reward (total and per component) of the reference action and of two query perturbations of it, over the
    first n states of `split` whose reference action has a `query`. Another state's query is taken by a seeded
    shuffle; a state whose query has three words or fewer becomes "x" when they are dropped."""

    script, training, _ = load_config(config, {"dataset_dir": dataset_dir, "model_name_or_path": "unused"})
    ds = _load_split(dataset_dir, split)
    keep = [i for i, r in enumerate(ds["reference_action"]) if "query" in (json.loads(r).get("arguments") or {})]
    ds = ds.select(keep[:n])
    if len(ds) < 2:
        raise ValueError(f"{dataset_dir}[{split}]: {len(ds)} states with a query; need at least 2")
    refs = [json.loads(r) for r in ds["reference_action"]]
    others = [a["arguments"]["query"] for a in refs]
    random.Random(0).shuffle(others)

    def call(a: dict, query: str) -> str:
        return Action(a["name"], {**a["arguments"], "query": query}).to_text()

    variants = {
        "reference": [call(a, a["arguments"]["query"]) for a in refs],
        "query_of_another_state": [call(a, q) for a, q in zip(refs, others, strict=True)],
        "query_first_3_words_dropped": [call(a, " ".join(a["arguments"]["query"].split()[3:]) or "x") for a in refs],
    }
    use_judge(build_judge(script.judge))
    out: dict = {"dataset_dir": dataset_dir, "split": split, "n": len(ds)}
    for name, completions in variants.items():
        out[name] = _rewards(completions, ds, training, ds["prompt"])[1]  # messages: offers_value_refs reads both
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="mean RL reward of greedy decisions on held-out ledger states")
    ap.add_argument("--dataset_dir", required=True, help="rl_states DatasetDict")
    ap.add_argument("--model", help="policy directory (full weights or a LoRA adapter); not with --sensitivity")
    ap.add_argument("--sensitivity", action="store_true", help="score the reference action and 2 near misses")
    ap.add_argument("--split", default="eval")
    ap.add_argument("--n", type=int, default=64, help="number of states")
    ap.add_argument("--config", help="RL recipe for the judge, weights and chat-template kwargs")
    ap.add_argument("--max_new_tokens", type=int, help="decision length (default: the recipe's max_completion_length)")
    ap.add_argument(
        "--samples", type=int, help="K: draw K decisions per state at the recipe's temperature (a GRPO group) instead"
    )
    ap.add_argument(
        "--scored",
        metavar="RL_OUT",
        help="only the states the GRPO run written to RL_OUT drew groups for (its scored_states.jsonl); see --which",
    )
    ap.add_argument("--which", choices=("in", "out"), default="in", help="with --scored: those states, or the others")
    ap.add_argument("--shuffle", type=int, metavar="SEED", help="n states drawn at random (seeded), not the first n")
    ap.add_argument(
        "--reference_tools",
        metavar="TOOLS",
        help="only the states whose reference decision calls one of these tools (comma-separated; e.g. code_executor:"
        " the program states, as rl.train's reference_tools)",
    )
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # which states a policy is scored on
    sel = {"scored": a.scored, "which": a.which, "shuffle": a.shuffle, "reference_tools": a.reference_tools}
    if a.sensitivity:
        res = reward_sensitivity(a.dataset_dir, a.split, a.n, a.config)
    elif not a.model:
        ap.error("--model is required (or --sensitivity)")
    elif a.samples:
        res = group_reach(a.dataset_dir, a.model, a.samples, a.split, a.n, a.config, a.max_new_tokens, **sel)
    else:
        res = score(a.dataset_dir, a.model, a.split, a.n, a.config, a.max_new_tokens, **sel)
    print(jsonio.dumps(res, nonfinite="string"))
    return res


if __name__ == "__main__":
    run_cli(main, "nothing was written")
