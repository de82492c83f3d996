"""collect.harvest: judged-correct trajectories -> SFT rows and RL states, split by task id. The trajectories are the
session's recorded teacher runs of the real runtime (tests/conftest.py); the incorrect ones are real one-step-budget
runs judged wrong."""

import copy
import json

import pytest
from datasets import load_from_disk

from collect.harvest import harvest, split_of
from collect.ledger import ledger_from_dict, ready


@pytest.fixture(scope="module")
def harvested(tmp_path_factory, recorded_runs):
    d = tmp_path_factory.mktemp("harvest")
    trajs = copy.deepcopy(recorded_runs)
    wrong = [t for t in trajs if t["correct"] is not True]
    right = [t for t in trajs if t["correct"] is True]
    assert len(wrong) >= 2 and all(t["outcome"] == "budget_exhausted" for t in wrong)
    # what the loop records for a step whose planner reply did not parse (a ModelError step): no action
    right[0]["steps"][0]["action"] = None
    right[1]["steps"][0]["action"] = {"name": "teleport", "arguments": {}}  # not in this step's tools
    path = d / "traj.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in trajs))
    stats = harvest(path, d / "data", eval_share=0.25, seed=0)
    return trajs, wrong, right, d / "data", stats


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_only_judged_correct_tasks_contribute(harvested):
    trajs, wrong, right, data, stats = harvested
    ids = {r["task_id"] for s in ("train", "eval") for r in _jsonl(data / f"sft.{s}.jsonl")}
    assert not ids & {t["task_id"] for t in wrong}
    assert ids == {t["task_id"] for t in right}
    assert stats["tasks_dropped_not_correct"] == len(wrong) and stats["tasks_kept"] == len(right)
    assert stats["tasks_seen"] == len(trajs)


def test_sft_prompt_is_byte_identical_to_planner_input(harvested):
    trajs, _, _, data, _ = harvested
    by_key = {(t["task_id"], s["t"]): s for t in trajs for s in t["steps"]}
    ds = load_from_disk(str(data / "sft"))
    for split in ("train", "eval"):
        rows = _jsonl(data / f"sft.{split}.jsonl")
        assert len(rows) == len(ds[split])
        for row, drow in zip(rows, ds[split], strict=True):
            if row["kind"] != "decision":
                continue
            step = by_key[(row["task_id"], row["step"])]
            expected = json.dumps(step["planner_input"]["messages"], ensure_ascii=False)
            assert json.dumps(row["prompt"], ensure_ascii=False) == expected
            assert json.dumps(drow["prompt"], ensure_ascii=False) == expected
            assert json.loads(row["tools"]) == step["planner_input"]["tools"]
            call = row["completion"][0]["tool_calls"][0]["function"]
            assert {"name": call["name"], "arguments": call["arguments"]} == step["action"]  # a mapping, not JSON
            assert drow["completion"][0]["tool_calls"][0]["function"] == call  # Arrow round trip: same keys, no nulls


def test_null_and_invalid_actions_do_not_become_rows(harvested):
    _, _, right, data, stats = harvested
    keys = {(r["task_id"], r["step"]) for s in ("train", "eval") for r in _jsonl(data / f"sft.{s}.jsonl")}
    first, second = (right[k]["steps"] for k in (0, 1))
    assert (right[0]["task_id"], first[0]["t"]) not in keys and (right[1]["task_id"], second[0]["t"]) not in keys
    assert (right[0]["task_id"], first[1]["t"]) in keys
    assert stats["steps_null_action"] == 1 and stats["steps_invalid_action"] == 1
    n_decisions = sum(len(t["steps"]) for t in right) - 2
    assert stats["sft_rows_by_kind"]["decision"] == n_decisions == sum(stats["rl_states"].values())
    assert sum(stats["action_distribution"].values()) == n_decisions


def test_no_task_in_both_train_and_eval_and_split_is_deterministic(harvested):
    *_, data, stats = harvested
    for name in ("sft", "rl_states"):
        ds = load_from_disk(str(data / name))
        train, ev = set(ds["train"]["task_id"]), set(ds["eval"]["task_id"])
        assert train and ev and not train & ev
        assert all(split_of(t, 0.25) == "eval" for t in ev) and all(split_of(t, 0.25) == "train" for t in train)
    assert stats["tasks_train"] + stats["tasks_eval"] == stats["tasks_kept"]
    assert json.loads((data / "harvest_stats.json").read_text()) == stats


def test_rl_state_rebuilds_the_ledger_the_planner_saw(harvested):
    trajs, _, _, data, _ = harvested
    rows = _jsonl(data / "rl_states.train.jsonl") + _jsonl(data / "rl_states.eval.jsonl")
    by_key = {(t["task_id"], s["t"]): s for t in trajs for s in t["steps"]}
    for r in rows:
        step = by_key[(r["task_id"], r["step"])]
        led = ledger_from_dict(json.loads(r["ledger"]))
        assert led.to_dict() == step["ledger_before"]
        # the teacher finishes exactly when the finish gate is open
        assert ready(led) == (json.loads(r["reference_action"])["name"] == "finish")
        assert r["tool_names"] == [t["function"]["name"] for t in step["planner_input"]["tools"]]
        assert json.loads(r["digest"])["finish_available"] == ready(led)


def test_need_parse_rows_carry_the_declared_needs(harvested):
    trajs, _, right, data, _ = harvested
    rows = [r for s in ("train", "eval") for r in _jsonl(data / f"sft.{s}.jsonl") if r["kind"] == "need_parse"]
    by_id = {t["task_id"]: t for t in trajs}
    assert len(rows) == len(right)
    for r in rows:
        t = by_id[r["task_id"]]
        assert r["prompt"] == t["need_parse"]["input"]["messages"] and r["tools"] == "[]"
        assert json.loads(r["completion"][0]["content"]) == t["need_parse"]["needs"]


def test_datasets_do_not_depend_on_the_order_tasks_finished_in(harvested, tmp_path):
    """Concurrent collect appends tasks in completion order; the harvested rows must not depend on it."""
    import random

    trajs, _, _, data, _ = harvested
    shuffled = trajs[:]
    random.Random(7).shuffle(shuffled)
    path = tmp_path / "shuffled.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in shuffled))
    harvest(path, tmp_path / "data", eval_share=0.25, seed=0)
    for name in ("sft.train.jsonl", "sft.eval.jsonl", "rl_states.train.jsonl"):
        assert (tmp_path / "data" / name).read_bytes() == (data / name).read_bytes(), name
