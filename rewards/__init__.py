"""Closure-aligned decision rewards (paper v3 Appendix F.3) in TRL's reward-function contract.

    r = a1 * valid + a2 * gate + a3 * target + a4 * align,   (a1..a4) = (0.1, 0.1, 0.2, 0.6) by default

valid and gate are ledger/schema rules (rewards.rules); target and align come from one judge call per candidate
(rewards.judge). ``REWARD_FUNCS`` maps each name to its function; pass ``list(REWARD_FUNCS.values())`` and the
matching weights to GRPOTrainer so TRL logs every component as ``rewards/<name>/mean``.
"""

from __future__ import annotations

import asyncio
import inspect
import math

from rewards.judge import JudgeConfig, OfflineJudge, OpenAIJudge, align, build_judge, get_judge, target, use_judge
from rewards.rules import gate, valid

REWARD_FUNCS = {"valid": valid, "gate": gate, "target": target, "align": align}
DEFAULT_WEIGHTS = {"valid": 0.1, "gate": 0.1, "target": 0.2, "align": 0.6}


def weights_list(weights: dict[str, float] | None = None) -> list[float]:
    """Weights in REWARD_FUNCS order; unknown names are an error, missing names take the paper default."""
    weights = dict(weights or {})
    unknown = set(weights) - set(REWARD_FUNCS)
    if unknown:
        raise ValueError(f"unknown reward weight(s) {sorted(unknown)}; known: {list(REWARD_FUNCS)}")
    return [float(weights.get(k, DEFAULT_WEIGHTS[k])) for k in REWARD_FUNCS]


async def score_components(completions: list, columns: dict) -> dict[str, list[float | None]]:
    """Every component for a batch of completions (columns: dataset columns as lists aligned with completions)."""
    out: dict[str, list[float | None]] = {}
    pending = {}
    for name, fn in REWARD_FUNCS.items():
        if inspect.iscoroutinefunction(fn):
            pending[name] = fn(completions, **columns)
        else:
            out[name] = fn(completions, **columns)
    for name, res in zip(pending, await asyncio.gather(*pending.values()), strict=True):
        out[name] = res
    return {k: out[k] for k in REWARD_FUNCS}


def total(components: dict[str, list[float | None]], weights: dict[str, float] | None = None) -> list[float | None]:
    """Weighted sum per completion; a skipped (None) component contributes nothing, as in TRL's nansum; a
    completion with every component skipped stays None."""
    w = dict(zip(REWARD_FUNCS, weights_list(weights), strict=True))
    n = len(next(iter(components.values())))
    out: list[float | None] = []
    for i in range(n):
        vals = [(w[k], components[k][i]) for k in components]
        kept = [(a, v) for a, v in vals if v is not None and not math.isnan(v)]
        out.append(sum(a * v for a, v in kept) if kept else None)
    return out


__all__ = [
    "REWARD_FUNCS",
    "DEFAULT_WEIGHTS",
    "JudgeConfig",
    "OfflineJudge",
    "OpenAIJudge",
    "align",
    "build_judge",
    "gate",
    "get_judge",
    "score_components",
    "target",
    "total",
    "use_judge",
    "valid",
    "weights_list",
]
