"""Worker processes on one machine (`workers: N | auto`): the same trajectories and summary as one process, written by
the parent through one path; bad values refused. SIGKILL of a worker or of the parent: tests/test_reliability.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from collect.config import CollectConfig, TaskSource, load_config
from collect.run import run_collection

ROOT = Path(__file__).resolve().parents[1]


def teacher_cfg(**over) -> CollectConfig:
    over = {"split": "test", "limit": 12, "progress": False, **over}
    return load_config(ROOT / "configs/collect/embedded.yaml", over)


def test_workers_value_is_validated_and_auto_is_the_usable_cores():
    import os

    assert CollectConfig(tasks=TaskSource(), workers="auto").n_workers() == len(os.sched_getaffinity(0))
    assert CollectConfig(tasks=TaskSource(), workers="3").n_workers() == 3  # from the CLI
    for bad in (0, -2, "many", 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            CollectConfig(tasks=TaskSource(), workers=bad)


def test_two_workers_write_the_same_records_and_summary_as_one_process(tmp_path, caplog):
    one = run_collection(teacher_cfg(), tmp_path / "one")
    with caplog.at_level(logging.INFO, logger="collect"):
        two = run_collection(teacher_cfg(workers=2), tmp_path / "two")
    started = [r for r in caplog.records if r.getMessage().startswith("worker ")]
    assert len(started) == 2, "two worker processes were started"
    assert two["workers"] == 2 and one["workers"] == 1
    a = sorted((tmp_path / "one/trajectories.jsonl").read_bytes().splitlines())
    b = sorted((tmp_path / "two/trajectories.jsonl").read_bytes().splitlines())
    assert len(a) == 12 and a == b, "every record byte-identical, each task once"
    timing = ("wall_s", "workers")
    assert {k: v for k, v in one.items() if k not in timing} == {k: v for k, v in two.items() if k not in timing}
    assert json.loads((tmp_path / "two/summary.json").read_text())["n_tasks"] == 12
    # resume with workers: nothing left to do, nothing written twice
    again = run_collection(teacher_cfg(workers=2), tmp_path / "two")
    assert again["n_tasks"] == 12 and len((tmp_path / "two/trajectories.jsonl").read_bytes().splitlines()) == 12


def test_eval_passes_workers_through_to_each_cell(tmp_path):
    import yaml

    from pipeline.eval import load_eval_config, run_eval

    p = tmp_path / "eval.yaml"
    base = str(ROOT / "configs/collect/embedded.yaml")
    p.write_text(yaml.safe_dump({"base": base, "split": "test", "limit": 4, "workers": 2}))
    summary = run_eval(load_eval_config(str(p)), tmp_path / "out")
    cells = list(summary["cells"].values())
    assert cells and all(c["workers"] == 2 and c["n_tasks"] == 4 for c in cells)
