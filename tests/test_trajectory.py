"""Trajectory files: atomic append, torn-line tolerance, resume ids, and replay of written runs."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from collect.replay import main as replay_main
from collect.trajectory import TrajectoryWriter, config_hash, finished_ids, read_trajectories
from tests.fakes import FakeChatServer, text, tool_call
from tests.helpers.loop_script import critic, needs_reply, run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def records(closure_run):
    """Three real runs through the fake server: accepted (the session's closure run), forced, insufficient."""
    recs = [copy.deepcopy(closure_run)]
    with FakeChatServer() as srv:
        srv.script("need_parser", needs_reply(), needs_reply())
        srv.script("planner", tool_call("finish", {"answer": "x"}), tool_call("finish", {"answer": "x"}))
        srv.script("finalizer", text("guess"))
        recs.append(run(srv, max_revisions=1))
        srv.script("planner", *[tool_call("web_search", {"query": f"q{k}", "need_index": 0}) for k in range(2)])
        srv.script("critic", critic(), critic())
        recs.append(run(srv, unfillable_after=2))
    for i, r in enumerate(recs):
        r["task_id"] = f"task-{i}"
    return recs


def test_written_trajectories_replay_to_the_recorded_hashes(tmp_path, records, capsys):
    path = tmp_path / "traj.jsonl"
    w = TrajectoryWriter(path)
    for r in records:
        w.append(r)
    assert [r["outcome"] for r in read_trajectories(path)] == ["accepted", "forced", "insufficient"]
    assert replay_main([str(path)]) == 0


def test_tampered_trajectory_makes_replay_fail_naming_the_task(tmp_path, records, capsys):
    path = tmp_path / "traj.jsonl"
    w = TrajectoryWriter(path)
    for r in records:
        w.append(r)
    lines = path.read_text().splitlines()
    rec = json.loads(lines[0])
    committed = [e for s in rec["steps"] for e in s["events"] if e["kind"] == "observation_committed"]
    committed[-1]["verdict"]["updates"][0]["value"] = "2001"  # a different fact than the one recorded
    lines[0] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert replay_main([str(path)]) == 1
    assert capsys.readouterr().out.split() == ["task-0"]


def test_replay_cli_exit_status(tmp_path, records):
    path = tmp_path / "traj.jsonl"
    TrajectoryWriter(path).append(records[0])
    ok = subprocess.run([sys.executable, "-m", "collect.replay", str(path)], cwd=ROOT, capture_output=True)
    assert ok.returncode == 0, ok.stderr
    rec = dict(records[0], final_ledger_hash="0" * 16)
    path.write_text(json.dumps(rec) + "\n")
    bad = subprocess.run([sys.executable, "-m", "collect.replay", str(path)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stdout.strip() == records[0]["task_id"]


def test_torn_last_line_is_skipped_by_reader_and_truncated_by_writer(tmp_path, records):
    path = tmp_path / "traj.jsonl"
    w = TrajectoryWriter(path)
    w.append(records[0])
    w.append(records[1])
    full = json.dumps(records[2])
    with open(path, "a") as f:
        f.write(full[: len(full) // 2])  # a crash mid-line
    with pytest.warns(UserWarning, match="broken trajectory line"):
        assert finished_ids(path) == {"task-0", "task-1"}
    with pytest.warns(UserWarning, match="torn last line"):
        w2 = TrajectoryWriter(path)
    w2.append(records[2])
    assert [r["task_id"] for r in read_trajectories(path)] == ["task-0", "task-1", "task-2"]


def test_each_record_is_exactly_one_line_with_the_documented_fields(tmp_path, records):
    path = tmp_path / "traj.jsonl"
    TrajectoryWriter(path).append(records[0])
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 2 and lines[1] == b""
    rec = json.loads(lines[0])
    for k in (
        "task_id",
        "config_hash",
        "arm",
        "models",
        "outcome",
        "answer",
        "need_parse",
        "initial_events",
        "steps",
        "final_events",
        "final_ledger",
        "final_ledger_hash",
        "usage",
        "faults",
    ):
        assert k in rec, k
    step = rec["steps"][0]
    for k in (
        "t",
        "planner_input",
        "planner_output",
        "action",
        "raw_observation",
        "observation",
        "verdict",
        "events",
        "ledger_before",
        "ledger_hash",
        "prompt_tokens",
        "completion_tokens",
        "latency_s",
    ):
        assert k in step, k
    assert set(step["planner_input"]) == {"messages", "tools"}


def test_config_hash_is_stable_and_sensitive():
    from collect.config import RuntimeConfig

    assert config_hash(RuntimeConfig(), {"planner": "m"}) == config_hash(RuntimeConfig(), {"planner": "m"})
    assert config_hash(RuntimeConfig(), {"planner": "m"}) != config_hash(RuntimeConfig(max_steps=9), {"planner": "m"})


def test_runtime_options_off_keep_the_config_hash_and_on_change_it():
    """Resumable OUT dirs from before the key keep their hash; a re-sampling run is a different config."""
    import hashlib

    from collect.config import CollectConfig, RuntimeConfig

    default = CollectConfig()
    d = default.to_dict()
    for k in ("limit", "progress", "harvest", "name", "workers", "shard"):
        d.pop(k)
    d["tasks"].pop("n_tasks")
    assert d["runtime"].pop("rejection_temperature") == 0.0  # the hash of the default is the hash without the keys
    assert d["runtime"].pop("reject_futile_calls") is False
    assert d["runtime"].pop("value_refs") is False
    assert d["runtime"].pop("window_refs") is False
    assert d["runtime"].pop("focus_refs") is False
    d["tools"]["web_stemmer"] = "english"  # the bm25 search the trajectories were made with
    assert default.hash() == hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]
    assert CollectConfig(runtime=RuntimeConfig(rejection_temperature=0.7)).hash() != default.hash()
    assert CollectConfig(runtime=RuntimeConfig(reject_futile_calls=True)).hash() != default.hash()
    assert CollectConfig(runtime=RuntimeConfig(value_refs=True)).hash() != default.hash()
    assert CollectConfig(runtime=RuntimeConfig(window_refs=True)).hash() != default.hash()
    assert CollectConfig(runtime=RuntimeConfig(focus_refs=True)).hash() != default.hash()
    with pytest.raises(ValueError, match="rejection_temperature must be in"):
        RuntimeConfig(rejection_temperature=-0.1)
