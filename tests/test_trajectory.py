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


def test_the_references_offered_are_part_of_the_config_hash_in_canonical_order():
    """Which references a run offers changes what its trajectories mean (prompts and the teacher's actions): every
    choice hashes apart, and the order a recipe lists them in does not matter (the prompt's order is fixed)."""
    from collect.config import CollectConfig, RuntimeConfig

    hashes = {
        refs: CollectConfig(runtime=RuntimeConfig(references=refs)).hash()
        for refs in [(), ("need",), ("need", "window"), ("need", "window", "focus"), ("window",)]
    }
    assert len(set(hashes.values())) == len(hashes)
    assert CollectConfig().hash() == hashes[("need", "window", "focus")]  # the default: all three
    assert (
        CollectConfig(runtime=RuntimeConfig(references=["focus", "window", "need"])).hash() == CollectConfig().hash()
    )
    with pytest.raises(ValueError, match="unknown reference kind 'values'"):
        RuntimeConfig(references=("values",))


# --------------------------------------------------------------------------------------------------------------------
# issue 52: lines a reader cannot trust, and values a writer cannot write
# --------------------------------------------------------------------------------------------------------------------

_UNTRUSTED_LINES = {
    "5000_digit_number": '{"task_id": "big", "x": ' + "9" * 5000 + "}",
    "nan_token": '{"task_id": "nan", "latency_s": NaN}',
    "infinity_token": '{"task_id": "inf", "steps": [{"time_range": [1e308, Infinity]}]}',
    "float_overflow": '{"task_id": "ovf", "x": 1e400}',
    "task_id_a_list": '{"task_id": ["a", "b"]}',
    "task_id_a_number": '{"task_id": 7}',
    "task_id_empty": '{"task_id": ""}',
    "nested_deep": '{"task_id": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "steps_not_a_list": '{"task_id": "shape", "steps": "none"}',
    "usage_not_an_object": '{"task_id": "shape2", "usage": [1]}',
}


def test_resume_skips_every_untrusted_line_naming_file_and_line(tmp_path, records):
    path = tmp_path / "traj.jsonl"
    w = TrajectoryWriter(path)
    w.append(records[0])
    with open(path, "a") as f:
        for line in _UNTRUSTED_LINES.values():
            f.write(line + "\n")
    w.append(records[1])
    with pytest.warns(UserWarning) as caught:
        ids = finished_ids(path)  # before: ValueError (int-string limit) / TypeError (unhashable list) tracebacks
    assert ids == {"task-0", "task-1"}
    msgs = [str(m.message) for m in caught]
    for k in range(2, 2 + len(_UNTRUSTED_LINES)):
        assert any(m.startswith(f"{path}:{k}: skipping") for m in msgs), (k, msgs)


@pytest.mark.parametrize(
    "value,where",
    [
        (float("inf"), "steps[0].action.arguments.time_range[1]"),
        (float("nan"), "steps[0].action.arguments.time_range[1]"),
    ],
)
def test_the_writer_refuses_a_value_json_cannot_hold_naming_its_field(tmp_path, value, where):
    path = tmp_path / "traj.jsonl"
    rec = {"task_id": "x", "steps": [{"action": {"name": "frame_confirm", "arguments": {"time_range": [0.0, value]}}}]}
    with pytest.raises(ValueError) as e:
        TrajectoryWriter(path).append(rec)  # before: written as a bare Infinity / NaN token
    assert where in str(e.value) and "task x" in str(e.value)
    assert not path.exists() or path.read_bytes() == b""


def test_a_resumed_out_with_untrusted_lines_reruns_those_tasks_and_summarizes(tmp_path):
    """The engine's resume (collect/run.py) on an OUT whose trajectories.jsonl holds a line with a 5,000-digit number
    and one whose task_id is a list: no traceback; the tasks of those lines run again; warnings name file and line."""
    from collect.config import load_config
    from collect.run import run_collection
    from tests.test_reliability import write_config

    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}))
        cfg = load_config(write_config(tmp_path / "c.yaml", srv.base_url, limit=3))
        out = tmp_path / "out"
        first = run_collection(cfg, out)
        traj = out / "trajectories.jsonl"
        lines = traj.read_text().splitlines()
        recs = [json.loads(x) for x in lines]
        ids = [r["task_id"] for r in recs]
        bad_list = json.dumps({**recs[1], "task_id": [recs[1]["task_id"]]})
        bad_big = json.dumps(recs[2]).replace('"model_errors": ', '"model_errors": ' + "9" * 5000 + ', "was": ', 1)
        traj.write_text("\n".join([lines[0], bad_list, bad_big]) + "\n")
        with pytest.warns(UserWarning) as caught:
            second = run_collection(cfg, out)  # before: TypeError / ValueError traceback naming no file or line
    msgs = [str(m.message) for m in caught]
    assert any(m.startswith(f"{traj}:2: skipping") for m in msgs) and any(
        m.startswith(f"{traj}:3: skipping") for m in msgs
    )
    assert first["n_tasks"] == second["n_tasks"] == 3 and second["errored_tasks"] == {}
    assert sorted(r["task_id"] for r in read_trajectories(traj)) == sorted(ids)  # the two tasks ran again, once
