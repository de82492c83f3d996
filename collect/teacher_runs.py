"""Recorded teacher runs: trajectories of the real runtime, for tests, the tiny tokenizer and CPU smoke runs.

Why: tests of harvest, SFT, RL, rewards and serving need planner states and actions. They come from exactly what
`make collect` runs: `collect.run.run_collection` with the embedded recipe (configs/collect/embedded.yaml: the
embedded world, the offline teacher roles of collect.teacher, the real ToolBox, collect.loop.run_task, the embedded
judge) over the first `n` tasks of a split. Rows come from `collect.harvest` (`rows_from_trajectory` / `harvest`).
There is no second teacher policy, prompt format, tool schema or train/eval split here.

Judged-incorrect trajectories (to test that harvest drops them) are real too: the same runtime with a one-step
budget (T = 1) runs out of budget after the teacher's first tool call, answers "insufficient" (Algorithm 1, line 20)
and the embedded judge marks it wrong, except on unanswerable tasks, where "insufficient" is the gold answer.

The offline teacher runs the 72 tasks of a split in about 2 s; results are cached per process (callers get copies).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from collect import jsonio
from collect.config import load_config
from collect.harvest import rows_from_trajectory
from collect.run import load_task_list, run_collection
from collect.trajectory import read_trajectories

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "collect" / "embedded.yaml"


@functools.lru_cache(maxsize=16)
def _collect(split: str, n: int | None, max_steps: int | None) -> tuple[str, ...]:
    """JSON lines of the collect engine's trajectories, in the split's task order (the engine appends in completion
    order). max_steps overrides T of the recipe."""
    cfg = load_config(RECIPE, {"split": split, "limit": n, "progress": False})
    # the paper's runtime, no references: these runs are also the tiny tokenizer's training text (sft.tiny), which
    # must not move when the recipe's references do
    cfg.runtime = dataclasses.replace(cfg.runtime, references=())
    if max_steps is not None:
        cfg.runtime = dataclasses.replace(cfg.runtime, max_steps=max_steps)
    with tempfile.TemporaryDirectory(prefix="teacher-runs-") as d:
        summary = run_collection(cfg, d)
        if summary["errored_tasks"]:
            raise RuntimeError(f"teacher runs: tasks failed: {summary['errored_tasks']}")
        records = list(read_trajectories(Path(d) / "trajectories.jsonl"))
    order = {t.id: i for i, t in enumerate(load_task_list(cfg))}
    records.sort(key=lambda r: order[r["task_id"]])
    return tuple(json.dumps(r, ensure_ascii=False) for r in records)


def trajectories(n: int | None = None, split: str = "train", *, wrong_share: float = 0.0) -> list[dict]:
    """Trajectory records (docs/trajectory.md, judged) of the first n tasks of an embedded split (all when None).

    wrong_share: that share of the tasks, spread evenly (every 4th task for 0.25), get the one-step-budget
    run's record instead, judged incorrect unless the task is unanswerable."""
    full = _collect(split, n, None)
    if wrong_share <= 0.0:
        return [json.loads(r) for r in full]
    short = _collect(split, n, 1)
    picked = [int((i + 1) * wrong_share) > int(i * wrong_share) for i in range(len(full))]
    return [json.loads(s if p else f) for f, s, p in zip(full, short, picked, strict=True)]


def write_trajectories(path: str | Path, records: list[dict]) -> Path:
    """Trajectory JSONL (the collect stage's trajectories.jsonl format) for collect.harvest."""
    path = Path(path)
    path.write_text("".join(jsonio.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def rl_rows(records: list[dict]) -> list[dict]:
    """rl_states rows (collect.harvest's format) of the judged-correct records, in record order."""
    stats: Counter = Counter()
    return [row for r in records if r.get("correct") is True for row in rows_from_trajectory(r, stats)[1]]


def texts(n: int | None = None, split: str = "train") -> Iterator[str]:
    """What the planner reads and writes in these runs: need-parser output, planner prompts, tool schemas, actions
    (tokenizer-training text)."""
    for tr in trajectories(n, split):
        yield tr["need_parse"]["output_text"]
        for st in tr["steps"]:
            for m in st["planner_input"]["messages"]:
                yield m["content"]
            yield json.dumps(st["planner_input"]["tools"], ensure_ascii=False)
            yield st["planner_output"]["text"]
