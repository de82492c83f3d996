"""Stale results are never shown as current (issue 52, class 1): a rerun on an OUT whose finished tasks changed in the
task file refuses and names them (or, with --rerun-changed, runs them again); a smaller selection than OUT holds is
refused (or, with --allow-subset, summarised as exactly that selection). The task file is written here by hand."""

from __future__ import annotations

import json
from pathlib import Path

from collect.__main__ import main as collect_main

LIGHTHOUSE = {
    "id": "hand-lighthouse",
    "question": "In which year was the Brackwater lighthouse first lit?",
    "answer": "1781",  # the author's typo: the corpus says 1871
    "answer_type": "number",
    "split": "test",
    "gold_chain": [
        {
            "need": "year the Brackwater lighthouse was first lit",
            "need_role": "external_fact",
            "preferred_source": "web",
            "query_focus": "Brackwater lighthouse first lit year",
            "gold_value": "1781",
        }
    ],
}
MILL = {
    "id": "hand-mill",
    "question": "How many sails does the Orrin windmill have?",
    "answer": "6",
    "answer_type": "number",
    "split": "test",
    "gold_chain": [
        {
            "need": "number of sails of the Orrin windmill",
            "need_role": "external_fact",
            "preferred_source": "web",
            "query_focus": "Orrin windmill number of sails",
            "gold_value": "6",
        }
    ],
}
CORPUS = [
    {"url": "https://example.org/brackwater", "title": "Brackwater lighthouse",
     "text": "The Brackwater lighthouse was first lit in 1871 and still guides boats into the estuary."},
    {"url": "https://example.org/orrin", "title": "Orrin windmill",
     "text": "The Orrin windmill, a tower mill on the ridge, turns 6 sails and grinds barley for the village."},
]  # fmt: skip


def _write(d: Path, tasks: list[dict]) -> Path:
    f = d / "hand.jsonl"
    f.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (d / "hand.corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CORPUS))
    return f


def _collect(f: Path, out: Path, *extra: str) -> int:
    argv = ["--config", "configs/collect/external_example.yaml", "--tasks", str(f), "--split", "all"]
    return collect_main([*argv, "--out", str(out), "--no-progress", "--no-harvest", *extra])


def test_a_fixed_task_is_refused_on_resume_then_run_again_when_asked(tmp_path, capsys):
    out = tmp_path / "out"
    f = _write(tmp_path, [LIGHTHOUSE, MILL])
    assert _collect(f, out) == 0
    first = json.loads((out / "summary.json").read_text())
    assert first["accuracy"] == 0.5  # the typo'd gold cannot be found in the corpus
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    mill_line = next(x for x in lines if json.loads(x)["task_id"] == "hand-mill")
    capsys.readouterr()

    fixed = {**LIGHTHOUSE, "answer": "1871"}
    fixed["gold_chain"] = [{**LIGHTHOUSE["gold_chain"][0], "gold_value": "1871"}]
    _write(tmp_path, [fixed, MILL])
    # the same command again: before, it resumed, ran nothing and reported the old 50% as current
    assert _collect(f, out) == 2
    err = capsys.readouterr().err
    assert "1 finished task(s) changed since they ran" in err and "hand-lighthouse" in err and "--rerun-changed" in err
    assert (out / "trajectories.jsonl").read_text().splitlines() == lines  # nothing touched
    assert json.loads((out / "summary.json").read_text()) == first

    assert _collect(f, out, "--rerun-changed") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"] == 1.0 and summary["n_tasks"] == 2
    now = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(now) == 2 and mill_line in now  # the unchanged task kept its record, byte for byte
    light = next(json.loads(x) for x in now if json.loads(x)["task_id"] == "hand-lighthouse")
    assert light["gold_answer"] == "1871" and light["correct"] is True
    assert _collect(f, out) == 0  # and a plain rerun resumes again


def test_a_smaller_selection_than_out_holds_is_refused_or_summarised_as_a_subset(tmp_path, capsys):
    out = tmp_path / "out"
    base = ["--split", "train", "--out", str(out), "--no-progress", "--no-harvest"]
    assert collect_main([*base, "--limit", "4"]) == 0
    full = json.loads((out / "summary.json").read_text())
    assert full["n_tasks"] == 4 and full["selection"]["n_selected"] == full["selection"]["n_records_in_out"] == 4
    capsys.readouterr()
    # before: exit 0 and summary.json rewritten with n_tasks 2 while the harvest still read all 4 records
    assert collect_main([*base, "--limit", "2"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 finished task(s) outside this selection" in err and "--allow-subset" in err
    assert json.loads((out / "summary.json").read_text()) == full
    assert collect_main([*base, "--limit", "2", "--allow-subset"]) == 0
    sub = json.loads((out / "summary.json").read_text())
    assert sub["n_tasks"] == 2 and sub["selection"] | {"task_ids_sha256": None} == {
        "split": "train",
        "limit": 2,
        "n_selected": 2,
        "task_ids_sha256": None,
        "n_records_in_out": 4,
    }
    assert sub["selection"]["task_ids_sha256"] != full["selection"]["task_ids_sha256"]
    assert collect_main([*base, "--limit", "6"]) == 0  # a larger selection extends the OUT
    assert json.loads((out / "summary.json").read_text())["n_tasks"] == 6
