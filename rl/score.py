"""Score a policy on held-out ledger states: one greedy decision per state, rewarded like RL (before/after numbers).

    python -m rl.score --dataset_dir DATA/rl_states --model M [--split eval] [--n 64] [--config configs/rl/X.yaml]
    python -m rl.score --dataset_dir DATA/rl_states --sensitivity [--split train] [--n 300]   # no model: the reward

`--sensitivity` asks whether the reward can tell a right decision from a near miss at all (no policy involved): the
recorded (teacher) action of each state with a query argument, the same call with the query of another state, and
the same call with the query's first three words dropped, each scored like an RL completion.

Prints (and returns) the mean weighted total and each component (valid, gate, target, align); judged components
skip failed judge calls (None), as in training. The judge, weights, chat-template kwargs, model dtype and decision
length come from --config (parsed by rl.train.parse_args like training), else from the defaults there: the offline
judge, the paper weights and TRL's GRPOConfig/ModelConfig defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os

log = logging.getLogger("rl.score")


def _mean(xs: list) -> float | None:
    kept = [x for x in xs if x is not None]
    return sum(kept) / len(kept) if kept else None


def reference_matches(completions: list[str], reference_actions: list[str]) -> dict:
    """How close the decisions are to the recorded (teacher) actions: the same tool; the same call, arguments
    included (canonical JSON); and, on states whose teacher call has a `query` (built from the need's query_focus),
    the same query string. An unparseable decision matches nothing."""
    from collect.ledger import call_signature, canonical_args
    from rewards.rules import parse_candidate

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
    from datasets import load_from_disk

    dd = load_from_disk(dataset_dir)
    if split not in dd:
        raise ValueError(f"{dataset_dir}: no split {split!r} (has {list(dd)})")
    return dd[split]


def _rewards(completions: list[str], ds, training) -> tuple[dict, dict]:
    """Every reward component of `completions` (aligned with the states `ds`), and the means: weighted total first."""
    from rewards import score_components, total
    from rl.train import named_weights

    columns = {k: ds[k] for k in ds.column_names if k != "prompt"}
    comps = asyncio.run(score_components(completions, columns))
    means = {"total": _mean(total(comps, named_weights(training.reward_weights)))}
    return comps, means | {k: _mean(v) for k, v in comps.items()}


def score(
    dataset_dir: str,
    model: str,
    split: str = "eval",
    n: int = 64,
    config: str | None = None,
    max_new_tokens: int | None = None,
    batch_size: int = 8,
) -> dict:
    """Greedy-decode one decision for each of the first n states of `split` and average every reward component."""
    import torch

    from rewards import build_judge, use_judge
    from rl.train import load_config, load_policy, render_prompts

    # without --config: TRL's defaults (GRPOConfig, ModelConfig), the offline judge and the paper weights
    script, training, model_args = load_config(config, {"dataset_dir": dataset_dir, "model_name_or_path": model})
    ds = _load_split(dataset_dir, split)
    ds = ds.select(range(min(n, len(ds))))
    policy, tok, _, _ = load_policy(model_args)
    policy.eval()
    texts = render_prompts(ds, tok, training.chat_template_kwargs)["prompt"]
    use_judge(build_judge(script.judge))
    max_new = max_new_tokens or training.max_completion_length
    completions: list[str] = []
    tok.padding_side = "left"
    for i in range(0, len(texts), batch_size):
        enc = tok(texts[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(policy.device) for k, v in enc.items()}
        with torch.no_grad():
            out = policy.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id)
        # decode like GRPO does (skip_special_tokens=True): the tool-call tags are ordinary added tokens
        completions += tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    comps, means = _rewards(completions, ds, training)
    matches = reference_matches(completions, ds["reference_action"])
    result = {
        "model": model,
        "split": split,
        "n": len(completions),
        **means,
        "judge_skipped": sum(v is None for v in comps["target"]),
        **matches,  # same tool / same call / same query as the recorded (teacher) action
    }
    return result


def reward_sensitivity(dataset_dir: str, split: str = "train", n: int = 300, config: str | None = None) -> dict:
    """Mean reward (total and per component) of the reference action and of two query perturbations of it, over the
    first n states of `split` whose reference action has a `query`. Another state's query is taken by a seeded
    shuffle; a state whose query has three words or fewer becomes "x" when they are dropped."""
    import random

    from collect.actions import Action
    from rewards import build_judge, use_judge
    from rl.train import load_config

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
        out[name] = _rewards(completions, ds, training)[1]
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
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.sensitivity:
        res = reward_sensitivity(a.dataset_dir, a.split, a.n, a.config)
    elif not a.model:
        ap.error("--model is required (or --sensitivity)")
    else:
        res = score(a.dataset_dir, a.model, a.split, a.n, a.config, a.max_new_tokens)
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
