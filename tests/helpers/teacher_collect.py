"""Teacher runs of the real collect engine on the first N train tasks of the 1,800-task embedded world with value
references (configs/collect/embedded_1800_refs.yaml), one runtime option changed: what the reference tests compare."""

from __future__ import annotations

import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collect_refs(out: Path, n_tasks: int, **runtime) -> tuple[list[dict], Path]:
    """(trajectories sorted by task id, out) of the offline teacher over the first n_tasks train tasks with the
    shipped value-reference recipe and `runtime` overrides (e.g. value_refs=False, window_refs=True)."""
    from collect.config import load_config
    from collect.run import run_collection
    from collect.trajectory import read_trajectories

    cfg = load_config(ROOT / "configs/collect/embedded_1800_refs.yaml", {"limit": n_tasks, "progress": False})
    assert cfg.runtime.value_refs is True  # the shipped recipe turns it on
    cfg.runtime = dataclasses.replace(cfg.runtime, **runtime)
    summary = run_collection(cfg, out)
    assert not summary["errored_tasks"]
    return sorted(read_trajectories(out / "trajectories.jsonl"), key=lambda r: r["task_id"]), out
