"""Shards across machines: `--shard K/N` picks a stable share of the tasks; `collect.merge` combines shard OUTs into
one whose harvest is byte-for-byte that of one unsharded run, and refuses overlapping or mixed-config inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collect.config import CollectConfig, TaskSource, load_config, parse_shard, shard_of
from collect.harvest import harvest
from collect.merge import MergeError, merge
from collect.merge import main as merge_main
from collect.run import RunDirError, load_task_list, run_collection

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 18
HARVEST_FILES = ("sft.train.jsonl", "sft.eval.jsonl", "rl_states.train.jsonl", "rl_states.eval.jsonl")


def teacher_cfg(**over) -> CollectConfig:
    """The embedded train split (harvested: training rows), every role the offline teacher (no endpoint)."""
    over = {"split": "train", "limit": LIMIT, "progress": False, **over}
    return load_config(ROOT / "configs/collect/embedded.yaml", over)


def test_shard_spec_is_validated():
    assert parse_shard("2/5") == (2, 5)
    for bad in ("5/5", "-1/3", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="shard"):
            CollectConfig(tasks=TaskSource(), shard=bad)


def test_shards_partition_the_task_set_by_a_stable_hash_of_the_id():
    full = load_task_list(teacher_cfg(limit=None))
    ids = [t.id for t in full]
    parts = [[t.id for t in load_task_list(teacher_cfg(limit=None, shard=f"{k}/4"))] for k in range(4)]
    assert sorted(i for p in parts for i in p) == sorted(ids), "every task in exactly one shard"
    assert all(parts), "no empty shard on 72 tasks"
    for k, p in enumerate(parts):
        assert all(shard_of(i, 4) == k for i in p)
        assert p == [i for i in ids if i in set(p)], "a shard keeps the split's order"
    # independent of order and of the other tasks: a task's shard is a function of its id and N alone
    assert [shard_of(i, 4) for i in reversed(ids)] == [shard_of(i, 4) for i in ids][::-1]
    assert shard_of(ids[0], 4) == shard_of(ids[0], 4) and shard_of("x", 1) == 0
    # shards are taken after split/limit: the shards of a limited run partition exactly that run's tasks
    limited = {t.id for t in load_task_list(teacher_cfg())}
    assert {t.id for k in range(3) for t in load_task_list(teacher_cfg(shard=f"{k}/3"))} == limited


def test_shard_and_workers_stay_out_of_the_config_hash():
    assert teacher_cfg().hash() == teacher_cfg(shard="1/3", workers=2).hash()
    assert teacher_cfg().hash() != teacher_cfg(runtime={"max_steps": 3}).hash()


@pytest.fixture(scope="module")
def shard_outs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for k in range(3):
        run_collection(teacher_cfg(shard=f"{k}/3"), root / f"s{k}")
    run_collection(teacher_cfg(), root / "single")
    return root


def test_merged_shards_harvest_byte_for_byte_like_one_unsharded_run(shard_outs, tmp_path):
    root = shard_outs
    n = [len((root / f"s{k}/trajectories.jsonl").read_text().splitlines()) for k in range(3)]
    assert sum(n) == LIMIT and all(n)
    merged = tmp_path / "merged"
    assert merge_main([str(root / f"s{k}") for k in (2, 0, 1)] + ["--out", str(merged)]) == 0  # any input order
    harvest(root / "single/trajectories.jsonl", tmp_path / "single_h", eval_share=0.1)
    for f in HARVEST_FILES:
        a, b = (tmp_path / "single_h" / f).read_bytes(), (merged / f).read_bytes()
        assert a == b, f
    assert (merged / "sft.train.jsonl").stat().st_size > 0
    # trajectories in task-id order, each line byte-identical to the unsharded run's line for that task
    single = {json.loads(x)["task_id"]: x for x in (root / "single/trajectories.jsonl").read_text().splitlines()}
    lines = (merged / "trajectories.jsonl").read_text().splitlines()
    ids = [json.loads(x)["task_id"] for x in lines]
    assert ids == sorted(single) and all(single[i] == x for i, x in zip(ids, lines, strict=True))
    s_one = json.loads((root / "single/summary.json").read_text())
    s_merged = json.loads((merged / "summary.json").read_text())
    for k in ("n_tasks", "accuracy", "outcomes", "by_family", "tool_distribution", "tokens", "usage_by_role"):
        assert s_merged[k] == s_one[k], k
    assert s_merged["config_hash"] == s_one["config_hash"] and s_merged["merge"]["missing_shards"] == []
    meta = json.loads((merged / "run_config.json").read_text())
    assert meta["config_hash"] == s_one["config_hash"] and meta["config"]["shard"] is None


def test_merge_refuses_a_task_in_two_inputs_and_writes_nothing(shard_outs, tmp_path):
    root = shard_outs
    out = tmp_path / "m"
    with pytest.raises(MergeError, match="twice"):  # the same shard given twice
        merge([root / "s0", root / "s1", root / "s0"], out)
    with pytest.raises(MergeError, match="split the tasks in different ways"):  # a shard and the whole run
        merge([root / "s0", root / "single"], out)
    # two unsharded runs over overlapping task sets: the shared task is refused by id
    other = tmp_path / "other"
    run_collection(teacher_cfg(limit=2), other)
    with pytest.raises(MergeError, match="refusing to merge duplicates"):
        merge([root / "single", other], out)
    assert not out.exists()
    assert merge_main([str(root / "single"), str(other), "--out", str(out)]) == 2


def test_merge_refuses_shards_of_different_configurations(shard_outs, tmp_path):
    odd = tmp_path / "s1_other_config"
    run_collection(teacher_cfg(shard="1/3", runtime={"max_steps": 6}), odd)
    with pytest.raises(MergeError, match="different configurations"):
        merge([shard_outs / "s0", odd, shard_outs / "s2"], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_missing_shards_are_reported_and_an_out_keeps_its_shard(shard_outs, tmp_path):
    args = [str(shard_outs / "s0"), str(shard_outs / "s2"), "--out", str(tmp_path / "m"), "--no-harvest"]
    assert merge_main(args) == 3  # merged, but not complete: exit 3 like a collect run with unfinished tasks
    assert json.loads((tmp_path / "m/summary.json").read_text())["merge"]["missing_shards"] == ["1/3"]
    with pytest.raises(RunDirError, match="shard"):  # one OUT holds one share: resuming it as another is refused
        run_collection(teacher_cfg(shard="2/3"), shard_outs / "s0")
