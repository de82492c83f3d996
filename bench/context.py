"""Context flatness (paper Fig. E.1): planner prompt tokens at step k / step 1, for k <= 15, per arm.

The same long scripted embedded-world tasks run under the ledger, memory and react arms: the planner is the offline
teacher, but only every 4th decision is useful (the others are off-target searches), so every run uses all 15 steps.
Tokens are counted with the tiny planner's tokenizer on the exact chat-template rendering (system + user + tools)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics

from collect.actions import Action
from collect.config import RuntimeConfig
from collect.loop import run_task
from collect.roles.base import PlannerReply, Usage
from collect.roles.render import truncate
from collect.teacher import make_teacher_roles
from collect.tools import ToolBox, ToolsConfig
from collect.world import load_world


class SlowTeacherPlanner:
    """Teacher decisions on every `every`-th call, a harmless off-target search otherwise."""

    def __init__(self, inner, every: int = 4):
        self.inner, self.every, self.n = inner, every, 0

    async def decide(self, messages, tools, *, r0, ledger, **sampling):
        self.n += 1
        if self.n % self.every == 0:
            return await self.inner.decide(messages, tools, r0=r0, ledger=ledger, **sampling)
        a = Action("web_search", {"query": f"unrelated weather report number {self.n}"})
        return PlannerReply(a.to_text(), [], Usage(model="scripted", calls=1))


def run(tokenizer, n_tasks: int = 8, steps: int = 15) -> dict:
    world = load_world(seed=0)
    tasks = [t for t in world.split("test") if t.family in ("anchor_compute", "multi_asset")][:n_tasks]
    out = {}
    for arm in ("ledger", "memory", "react"):
        cfg = RuntimeConfig(arm=arm, max_steps=steps, unfillable_after=99)
        per_step: dict[int, list[int]] = {}
        persistent: dict[int, list[int]] = {}
        for task in tasks:
            roles = make_teacher_roles(task)
            roles = dataclasses.replace(roles, planner=SlowTeacherPlanner(roles.planner))
            r0 = task.to_context(cfg.budget())
            rec = asyncio.run(run_task(task, roles, ToolBox(task, r0, ToolsConfig(), corpus=world.corpus), cfg))
            for s in rec["steps"]:
                pi = s["planner_input"]
                ids = tokenizer.apply_chat_template(
                    pi["messages"], tools=pi["tools"], add_generation_prompt=True, tokenize=True, return_dict=False
                )
                per_step.setdefault(int(s["t"]), []).append(len(ids))
                # the latest raw observation is shown once (not persistent); its share, to separate the two
                latest = truncate(s.get("latest_observation") or "", cfg.max_observation_chars)
                obs_tokens = len(tokenizer(latest, add_special_tokens=False)["input_ids"]) if latest else 0
                persistent.setdefault(int(s["t"]), []).append(len(ids) - obs_tokens)
        means = {k: statistics.mean(v) for k, v in sorted(per_step.items())}
        pmeans = {k: statistics.mean(v) for k, v in sorted(persistent.items())}
        out[arm] = {
            "tokens_by_step": {k: round(v, 1) for k, v in means.items()},
            "ratio_by_step": {k: round(v / means[1], 3) for k, v in means.items()},
            "persistent_ratio_by_step": {k: round(v / pmeans[1], 3) for k, v in pmeans.items()},
        }
    last = max(out["ledger"]["ratio_by_step"])
    r = out["ledger"]["ratio_by_step"][last]
    return {
        "name": "context_flatness",
        "figure": r,
        "unit": f"ledger prompt tokens step {last} / step 1",
        "target": "<= 1.25",
        "met": r <= 1.25,
        "inputs": {"tasks": [t.id for t in tasks], "max_steps": steps, "useful_every": 4},
        "extra": {
            "ledger_persistent_ratio_at_last (prompt minus the latest observation shown once)": out["ledger"][
                "persistent_ratio_by_step"
            ].get(last),
            "memory_ratio_at_last": out["memory"]["ratio_by_step"].get(last),
            "react_ratio_at_last": out["react"]["ratio_by_step"].get(last),
            "arms": out,
        },
    }
