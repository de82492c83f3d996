"""Closure-aligned decision rewards (paper v3 Appendix F.3) in TRL's reward-function contract.

    r = a1 * valid + a2 * gate + a3 * target + a4 * align,   (a1..a4) = (0.1, 0.1, 0.2, 0.6) by default

valid and gate are ledger/schema rules (rewards.rules); target and align come from one judge call per candidate
(rewards.judge). A fifth, ``compute`` (rewards.execution), is not the paper's and weighs 0 by default: on a state whose
reference decision is a program it runs the candidate's program and the reference's in the sandbox and is 1 when they
print the same value (None on other states). ``REWARD_FUNCS`` maps each name to its function; pass
``list(REWARD_FUNCS.values())`` and the matching weights to GRPOTrainer so TRL logs every component as
``rewards/<name>/mean``.
"""

from __future__ import annotations

import asyncio
import inspect
import math

from rewards.execution import ExecutionCheck, compute, get_execution_check, use_execution_check
from rewards.judge import JudgeConfig, OfflineJudge, OpenAIJudge, align, build_judge, get_judge, target, use_judge
from rewards.rules import gate, valid

REWARD_FUNCS = {"valid": valid, "gate": gate, "target": target, "align": align, "compute": compute}
DEFAULT_WEIGHTS = {"valid": 0.1, "gate": 0.1, "target": 0.2, "align": 0.6, "compute": 0.0}
PAPER_REWARDS = ("valid", "gate", "target", "align")  # alpha_1..alpha_4 of paper v3 Appendix F.3, in this order


UNWEIGHTED_SKIPPED = ("compute",)  # costly and not the paper's: not run at all while its weight is 0


def trainer_reward_funcs(weights: dict[str, float] | None = None) -> list:
    """The reward functions for GRPOTrainer, in REWARD_FUNCS order. One in UNWEIGHTED_SKIPPED whose weight is 0 is
    replaced by a function of the same name that skips every completion (None; TRL logs it as NaN), so a recipe
    without ``compute`` runs no program; the others are always computed and logged, whatever their weight."""
    w = dict(zip(REWARD_FUNCS, weights_list(weights), strict=True))
    out = []
    for name, fn in REWARD_FUNCS.items():
        if name in UNWEIGHTED_SKIPPED and w[name] == 0:

            def skipped(completions: list, **kwargs) -> list[float | None]:
                return [None] * len(completions)

            skipped.__name__ = skipped.__qualname__ = name  # TRL logs rewards/<__name__>/mean
            fn = skipped
        out.append(fn)
    return out


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
    "ExecutionCheck",
    "JudgeConfig",
    "PAPER_REWARDS",
    "OfflineJudge",
    "OpenAIJudge",
    "align",
    "build_judge",
    "compute",
    "gate",
    "get_execution_check",
    "get_judge",
    "score_components",
    "target",
    "total",
    "trainer_reward_funcs",
    "use_execution_check",
    "use_judge",
    "valid",
    "weights_list",
]
