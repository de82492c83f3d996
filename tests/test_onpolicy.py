"""On-policy relabelling (pipeline.relabel, pipeline.onpolicy): a scripted student planner (loopback fake server) runs
the real runtime over two train tasks; every state it reached becomes a row labelled by the offline teacher, in
harvest's row format, never from a test-split task; the aggregate dedupes prompts; rl.train reads the on-policy
states."""

from __future__ import annotations

import json
import types
from collections import Counter
from pathlib import Path

import pytest

from collect.actions import offered_refs
from collect.config import load_config
from collect.harvest import harvest
from collect.ledger import ledger_from_dict
from collect.run import run_collection
from collect.teacher import TeacherPlanner
from collect.trajectory import read_trajectories
from pipeline.relabel import (
    TestSplitError,
    aggregate,
    check_split,
    r0_from_dict,
    relabel_trajectories,
    run_relabel,
)
from rl.train import load_state_pool
from tests.fakes import FakeChatServer, text, tool_call
from tests.helpers.loop_script import fake_checkpoint

ROOT = Path(__file__).resolve().parents[1]
BASE = str(ROOT / "configs/collect/embedded.yaml")
N_TASKS = 2
STEPS = 15  # runtime.max_steps of the embedded recipe: every scripted run ends budget_exhausted


def _student_script(srv: FakeChatServer) -> None:
    """Per task: a premature finish (blocked), an off-target search, then unparseable replies until the budget ends."""
    for _ in range(N_TASKS):
        srv.script(
            "planner",
            tool_call("finish", {"answer": "42"}),
            tool_call("web_search", {"query": "weather report of an unrelated city"}),
            *[text("I am not sure what to do.") for _ in range(STEPS - 2)],
        )
    srv.default("planner", text("still not sure"))


@pytest.fixture(scope="module")
def relabelled(tmp_path_factory):
    d = tmp_path_factory.mktemp("onpolicy")
    # the teacher's own run of the same tasks, harvested (the round-0 data)
    cfg = load_config(BASE, {"split": "train", "limit": N_TASKS, "progress": False})
    run_collection(cfg, d / "teacher")
    harvest(d / "teacher" / "trajectories.jsonl", d / "teacher", eval_share=0.0)
    with FakeChatServer() as srv:
        _student_script(srv)
        spec = {"endpoint": {"base_url": srv.base_url, "model": "student", "max_retries": 0}}
        stats = run_relabel(spec, d / "round1", 1, config=BASE, split="train", limit=N_TASKS, concurrency=1)
        assert not srv.misses
    return d, stats


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_rows_are_the_students_states_labelled_by_the_teacher(relabelled):
    d, stats = relabelled
    student = list(read_trajectories(d / "round1/collect/trajectories.jsonl"))
    assert len(student) == N_TASKS and {r["models"]["planner"] for r in student} == {"student"}
    assert all(r["models"]["critic"] != "student" for r in student)  # only the planner is swapped
    sft, rl = _jsonl(d / "round1/onpolicy_sft.jsonl"), _jsonl(d / "round1/onpolicy_rl_states.jsonl")
    steps = {(r["task_id"], s["t"]): (r, s) for r in student for s in r["steps"]}
    assert len(sft) == len(rl) == len(steps) == stats["states"] > 2 * N_TASKS
    teacher = TeacherPlanner()
    disagreements = 0
    for srow, rrow in zip(sft, rl, strict=True):
        traj, st = steps[(srow["task_id"], srow["step"])]
        assert srow["prompt"] == st["planner_input"]["messages"] == rrow["prompt"]  # the student's state, unchanged
        assert json.loads(rrow["ledger"]) == st["ledger_before"]
        refs = offered_refs(st["planner_input"]["messages"])  # what the student's prompt offered (the default: all)
        assert refs == ("need", "window", "focus")
        r0, ledger = r0_from_dict(traj["r0"]), ledger_from_dict(st["ledger_before"])
        want = teacher.choose(r0, ledger, rrow["tool_names"], refs)
        assert json.loads(rrow["reference_action"]) == want.to_dict()  # the label is the teacher's
        call = srow["completion"][0]["tool_calls"][0]["function"]
        assert (call["name"], call["arguments"]) == (want.name, want.arguments)  # arguments as a mapping
        assert (srow["origin"], srow["round"], rrow["origin"], rrow["round"]) == ("onpolicy", 1, "onpolicy", 1)
        disagreements += st["action"] != want.to_dict()
    assert disagreements >= len(sft) - N_TASKS  # the student's own actions are not what was learned
    # its own mistakes are states: blocked finishes and rejected replies, which the teacher's run never reaches
    texts = [json.dumps(r["prompt"]) for r in sft]
    assert sum("previous reply was rejected" in t for t in texts) >= N_TASKS * (STEPS - 4)
    assert stats["states_after_rejected_reply"] >= N_TASKS * (STEPS - 4)
    teacher_prompts = {json.dumps(r["prompt"]) for r in _jsonl(d / "teacher/sft.train.jsonl")}
    assert sum(t not in teacher_prompts for t in texts) >= len(texts) - N_TASKS
    # harvest's exact row format (same keys as the teacher rows)
    assert set(sft[0]) == set(_jsonl(d / "teacher/sft.train.jsonl")[-1])
    assert set(rl[0]) == set(_jsonl(d / "teacher/rl_states.train.jsonl")[0])
    # no test-split task
    from collect.run import embedded_world

    split = {t.id: t.split for t in embedded_world(0).tasks}
    assert {split[r["task_id"]] for r in sft} == {"train"}


def test_aggregate_is_teacher_plus_onpolicy_rows_with_identical_prompts_once(relabelled, tmp_path):
    d, _ = relabelled
    out = tmp_path / "agg"
    res = aggregate(d / "teacher", [d / "round1"], out, eval_share=0.0)
    teacher = _jsonl(d / "teacher/sft.train.jsonl")
    onpolicy = _jsonl(d / "round1/onpolicy_sft.jsonl")
    rows = _jsonl(out / "sft.train.jsonl")
    keys = [json.dumps([r["kind"], r["prompt"]], sort_keys=True) for r in rows]
    assert len(keys) == len(set(keys))  # identical prompts once
    by_origin = Counter(r["origin"] for r in rows)
    assert by_origin["teacher"] == len(teacher)
    # step 1 of the student sees exactly the teacher's step-1 prompt: that duplicate keeps the teacher row
    dropped = res["sft"]["onpolicy_duplicates_dropped"]
    assert dropped >= N_TASKS and by_origin["onpolicy"] == len(onpolicy) - dropped
    # a second round reusing the same folder adds nothing new
    res2 = aggregate(d / "teacher", [d / "round1", d / "round1"], tmp_path / "agg2", eval_share=0.0)
    assert res2["sft"]["rows"] == res["sft"]["rows"]
    from datasets import load_from_disk

    assert len(load_from_disk(str(out / "rl_states"))["train"]) == res["rl_states"]["rows"]["train"]


def test_test_split_is_refused_before_anything_runs(tmp_path, relabelled):
    for split in ("test", "all"):
        with pytest.raises(TestSplitError, match="test split"):
            run_relabel("offline", tmp_path / split, 1, config=BASE, split=split, limit=1)
        assert not (tmp_path / split).exists()
    with pytest.raises(TestSplitError, match="test-split task"):
        check_split("train", [types.SimpleNamespace(id="t1", split="test")])
    d, _ = relabelled
    ids = {r["task_id"] for r in read_trajectories(d / "round1/collect/trajectories.jsonl")}
    with pytest.raises(TestSplitError, match="refusing"):
        relabel_trajectories(d / "round1/collect/trajectories.jsonl", 1, forbidden_ids={sorted(ids)[0]})
    from pipeline.onpolicy import OnPolicyConfig
    from pipeline.relabel import main

    assert main(["--planner", "offline", "--out", str(tmp_path / "cli"), "--split", "test"]) == 2
    with pytest.raises(TestSplitError):
        OnPolicyConfig(split="test")


@pytest.mark.slow
def test_a_checkpoint_student_run_in_task_shards_gives_what_one_process_gives(tmp_path, tiny_model):
    """relabel_processes / --processes: the student's tasks in 2 spawned processes, each serving the checkpoint, then
    merged; the rows, labels and student figures must be those of one process, and a rerun resumes the shards."""
    spec = {"checkpoint": str(tiny_model)}
    kw = {"config": BASE, "split": "train", "limit": 4, "concurrency": 2}
    kw["planner_defaults"] = {"max_tokens": 12, "timeout_s": 60.0, "max_retries": 0}
    one = run_relabel(spec, tmp_path / "one", 1, **kw)
    two = run_relabel(spec, tmp_path / "two", 1, processes=2, **kw)
    for name in ("onpolicy_sft.jsonl", "onpolicy_rl_states.jsonl"):
        a, b = _jsonl(tmp_path / "one" / name), _jsonl(tmp_path / "two" / name)
        assert a == b and len(a) > 0, name
    assert two == one and one["tasks"] == 4
    shard_tasks = [
        {r["task_id"] for r in read_trajectories(tmp_path / "two" / "shards" / k / "trajectories.jsonl")}
        for k in ("0", "1")
    ]
    assert all(shard_tasks) and not shard_tasks[0] & shard_tasks[1]  # both shards ran, no task twice
    merged = [r["task_id"] for r in read_trajectories(tmp_path / "two" / "collect" / "trajectories.jsonl")]
    assert sorted(merged) == sorted(shard_tasks[0] | shard_tasks[1])
    # a rerun (a killed round resumed): the shards are served on new ports and still resume, nothing is re-run
    before = (tmp_path / "two" / "collect" / "trajectories.jsonl").read_bytes()
    assert run_relabel(spec, tmp_path / "two", 1, processes=2, **kw) == two
    assert (tmp_path / "two" / "collect" / "trajectories.jsonl").read_bytes() == before
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        run_relabel({"checkpoint": str(tmp_path / "gone")}, tmp_path / "x", 1, processes=2, **kw)


def test_onpolicy_recipe_parses_and_rejects_unknown_keys(tmp_path):
    from pipeline.onpolicy import load_onpolicy_config

    cfg = load_onpolicy_config(str(ROOT / "configs/onpolicy/tiny.yaml"), {"rounds": 3})
    assert cfg.rounds == 3 and cfg.split == "train" and Path(ROOT / cfg.sft_config).exists()
    p = tmp_path / "o.yaml"
    p.write_text("roundz: 2\n")
    with pytest.raises(ValueError, match="roundz"):
        load_onpolicy_config(str(p))
    for bad in (0, -1, "two", 1.5):
        p.write_text(f"relabel_processes: {bad}\n")
        with pytest.raises(ValueError, match="relabel_processes"):
            load_onpolicy_config(str(p))
    p.write_text("relabel_processes: auto\n")
    assert load_onpolicy_config(str(p)).relabel_processes == "auto"


def test_rl_reads_onpolicy_states_from_several_dirs(relabelled, tmp_path):
    from datasets import Dataset, DatasetDict

    d, _ = relabelled
    agg = tmp_path / "agg"
    aggregate(d / "teacher", [d / "round1"], agg, eval_share=0.0)
    # a teacher pool written before the origin column existed counts as teacher rows
    old = [
        {k: v for k, v in r.items() if k not in ("origin", "round")}
        for r in _jsonl(d / "teacher/rl_states.train.jsonl")
    ]
    DatasetDict({"train": Dataset.from_list(old)}).save_to_disk(str(tmp_path / "old"))
    both = load_state_pool(f"{tmp_path / 'old'},{agg / 'rl_states'}")
    n_agg = len(_jsonl(agg / "rl_states.train.jsonl"))
    assert len(both) == len(old) + n_agg
    assert Counter(both["origin"])["teacher"] == 2 * len(old)
    only = load_state_pool(f"{tmp_path / 'old'},{agg / 'rl_states'}", origins="onpolicy")
    student_prompts = {json.dumps(r["prompt"]) for r in _jsonl(d / "round1/onpolicy_rl_states.jsonl")}
    assert len(only) > 0 and set(only["origin"]) == {"onpolicy"}
    assert {json.dumps(p) for p in only["prompt"]} <= student_prompts
    with pytest.raises(ValueError, match="no train states of origin"):
        load_state_pool(str(tmp_path / "old"), origins="onpolicy")

    # rl.train's recipe takes the same options and its trainer trains on exactly those states
    from rl.train import build_trainer
    from rl.train import load_config as rl_config
    from sft.tiny import build_tiny_model

    texts = [m["content"] for p in only["prompt"][:4] for m in p]
    base = build_tiny_model(tmp_path / "tiny", texts=texts, seed=0, hidden_size=32, num_layers=1)
    recipe = rl_config(
        str(ROOT / "configs/rl/tiny.yaml"),
        {
            "dataset_dir": f"{tmp_path / 'old'},{agg / 'rl_states'}",
            "origins": "onpolicy",
            "model_name_or_path": str(base),
            "output_dir": str(tmp_path / "rl"),
            "max_steps": 1,
        },
    )
    assert recipe.script.origins == "onpolicy"
    trainer, tok, _, _, n_states = build_trainer(recipe)
    assert n_states == len(only)
    assert set(trainer.train_dataset["origin"]) == {"onpolicy"}
    assert any("previous reply was rejected" in p for p in trainer.train_dataset["prompt"])  # rendered student states


# ---- evaluation: seeds per planner, pooled cells, held-out figures, report ------------------------------------------


def test_eval_seed_lists_expand_to_one_planner_per_checkpoint(tmp_path):
    from pipeline.eval import EvalConfig

    cfg = EvalConfig(planners={"t": "offline", "sft": {"checkpoint": ["a", "b"], "endpoint": {"max_tokens": 8}}})
    assert cfg.planners == {
        "t": "offline",
        "sft@0": {"checkpoint": "a", "endpoint": {"max_tokens": 8}},
        "sft@1": {"checkpoint": "b", "endpoint": {"max_tokens": 8}},
    }
    assert EvalConfig(planners={"one": {"checkpoint": ["a"]}}).planners == {"one": {"checkpoint": "a"}}
    with pytest.raises(ValueError, match="seed list"):
        EvalConfig(planners={"x@1": {"checkpoint": ["a", "b"]}})


def test_eval_pools_seeds_with_heldout_figures_and_the_report_shows_them(tmp_path, monkeypatch):
    """Two 'seeds' of a served planner (the loopback fake stands in for serve.local) over 2 test tasks: a cell per
    seed, one pooled row with a Wilson interval over all 4 task runs, answerable / unanswerable figures, held-out
    scores per checkpoint (rl.score replaced by a stub here: the real scorer is tested in test_rl.py)."""

    import pipeline.eval
    import pipeline.planners
    import pipeline.report
    from collect.summary import wilson
    from pipeline.eval import load_eval_config, run_eval

    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "insufficient"}))
        srv.script("planner", text("no tool call at all"))  # sft@0's first task: one rejected reply

        class Served:
            base_url = srv.base_url

            def __init__(self, ckpt):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        monkeypatch.setattr(pipeline.planners, "LocalServer", Served)
        scored = []

        def fake_score(dataset_dir, model, split="eval", n=64, config=None, **kw):
            scored.append((dataset_dir, Path(model).name, split))
            s0 = model.endswith("s0")
            return {"n": 3, "valid": 1.0 if s0 else 0.5, "reference_tool_match": 0.25, "total": 0.4} | {
                "compute": 0.5 if s0 else 0.25  # the greedy program right (rewards.execution), pooled over seeds
            }

        monkeypatch.setattr(pipeline.eval, "score", fake_score)
        for s in ("s0", "s1"):
            fake_checkpoint(tmp_path / s)
        p = tmp_path / "e.yaml"
        p.write_text(
            json.dumps(
                {
                    "base": BASE,
                    "split": "test",
                    "limit": 2,
                    "planners": {
                        "teacher": "offline",
                        "sft": {"checkpoint": [str(tmp_path / "s0"), str(tmp_path / "s1")]},
                    },
                    "heldout": {"dataset_dir": "HELD", "split": "train"},
                    "concurrency": 1,
                }
            )
        )
        summary = run_eval(load_eval_config(str(p)), tmp_path / "out")
    assert set(summary["cells"]) == {f"{n}__ledger__annotations" for n in ("teacher", "sft@0", "sft@1")}
    assert sorted(scored) == [("HELD", "s0", "train"), ("HELD", "s1", "train")]
    pooled = summary["planners"]
    assert set(pooled) == {"teacher__ledger__annotations", "sft__ledger__annotations"}
    sft = pooled["sft__ledger__annotations"]
    cells = [summary["cells"][f"sft@{i}__ledger__annotations"] for i in (0, 1)]
    k = sum(c["correct"] for c in cells)
    assert sft["n_seeds"] == 2 and sft["n_task_runs"] == 4 and sft["correct"] == k
    assert sft["ci95"] == [round(x, 4) for x in wilson(k, 4)]
    assert sft["seed_accuracies"] == [c["accuracy"] for c in cells]
    assert sum(sft["outcomes"].values()) == 4
    assert sft["heldout"] == {"valid": 0.75, "reference_tool_match": 0.25, "compute": 0.375, "total": 0.4}
    assert pooled["teacher__ledger__annotations"]["heldout"] is None
    assert (sft["tasks_with_rejected_reply"], sft["most_rejected_in_one_task"]) == (1, 1)
    assert sft["valid_action_rate"] == (sft["planner_calls"] - 1) / sft["planner_calls"]
    assert sft["answerable"]["n"] + sft["unanswerable"]["n"] == 4
    assert sft["answerable"]["correct"] == 0  # "insufficient" never answers an answerable task
    una = [
        r
        for i in (0, 1)
        for r in read_trajectories(tmp_path / f"out/cells/sft@{i}__ledger__annotations/trajectories.jsonl")
    ]
    una = [r for r in una if r["task_meta"]["answer_type"] == "unanswerable"]
    assert sft["unanswerable"]["declared_insufficient"] == sum(r["outcome"] == "insufficient" for r in una)
    assert json.loads((tmp_path / "out/summary.json").read_text())["planners"] == pooled
    from pipeline.eval import format_planners

    assert "sft__ledger__annotations" in format_planners(summary) and "75.0%" in format_planners(summary)

    html = (tmp_path / "out/report.html").read_text()
    assert "Planners (seeds pooled)" in html and "sft__ledger__annotations" in html and "75.0%" in html
    assert "(1 runs; max 1)" in html
    assert "<th>held-out right program</th>" in html and "<td>37.5%</td></tr>" in html

    # the context plot leaves out the teacher (no token counts) instead of drawing it at 0
    assert all(
        v == 0 for v in summary["cells"]["teacher__ledger__annotations"]["planner_prompt_tokens_by_step"].values()
    )
    cells_t = {
        "teacher": {"planner_prompt_tokens_by_step": {"1": 0, "2": 0}},
        "sft": {"planner_prompt_tokens_by_step": {"1": 500, "2": 650}},
    }
    page = pipeline.report.render_report("t", cells_t, {"teacher": [], "sft": []})

    assert page.count("<polyline") == 1  # only the planner with token counts is drawn
    assert "left out (no token counts): teacher" in page


def test_measurement_eval_config_has_two_seeds_per_trained_planner_on_the_full_test_split():
    from pipeline.eval import load_eval_config

    cfg = load_eval_config(str(ROOT / "configs/eval/measure.yaml"))
    assert cfg.split == "test" and cfg.limit is None and cfg.heldout["dataset_dir"]
    fams = Counter(n.split("@")[0] for n in cfg.planners)
    assert fams == {
        "teacher": 1,
        "tiny-untrained": 2,
        "tiny-sft": 2,
        "tiny-sft-onpolicy": 2,
        "tiny-sft-onpolicy-rl": 2,
    }


def test_onpolicy_rounds_pass_seed_and_teacher_data_and_resume_finished_rounds(tmp_path, monkeypatch):
    """The orchestration alone (relabel, aggregate and the training subprocesses replaced by recorders): `--seed`
    reaches every SFT round and GRPO, `--teacher-data` reaches the aggregate, and a rerun after a crash in round 2
    keeps round 1 instead of relabelling and training it again."""
    import pipeline.onpolicy as op

    calls: list = []
    crash = {"on_round": 2}

    def fake_relabel(planner, rdir, k, **kw):
        calls.append(("relabel", k, planner["checkpoint"]))
        if crash["on_round"] == k:
            raise RuntimeError("killed")
        return {"round": k}

    def fake_aggregate(teacher, rounds, out, share, seed):
        calls.append(("aggregate", str(teacher), len(rounds)))
        return {}

    def fake_stage(args):
        calls.append(("stage", args[0], args[args.index("--seed") + 1] if "--seed" in args else None))
        out = Path(args[args.index("--output_dir") + 1])
        (out / "merged").mkdir(parents=True, exist_ok=True)
        return 0.0

    monkeypatch.setattr(op, "run_relabel", fake_relabel)
    monkeypatch.setattr(op, "aggregate", fake_aggregate)
    monkeypatch.setattr(op, "_stage", fake_stage)
    start = tmp_path / "sft0"
    start.mkdir()
    argv = ["--model", str(start), "--out", str(tmp_path / "op"), "--teacher-data", "T", "--seed", "7"]
    argv += ["--rounds", "2", "--config", str(ROOT / "configs/onpolicy/tiny.yaml")]
    with pytest.raises(RuntimeError, match="killed"):  # the crash in round 2 propagates
        op.main(argv)
    assert ("aggregate", "T", 1) in calls and ("stage", "sft.train", "7") in calls
    calls.clear()
    crash["on_round"] = None
    assert op.main(argv) == 0
    # round 1 kept (no relabel, no training), round 2 started from round 1's model, GRPO with the seed
    r1_model = str(tmp_path / "op" / "round1" / "sft" / "merged")
    assert [c for c in calls if c[0] == "relabel"] == [("relabel", 2, r1_model)]
    assert [c for c in calls if c[0] == "stage"] == [("stage", "sft.train", "7"), ("stage", "rl.train", "7")]
    summary = json.loads((tmp_path / "op" / "onpolicy_summary.json").read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2] and summary["config"]["teacher_data"] == "T"
    # final_sft names the last round's planner, and it is the path the measurement eval config reads
    op_dir = tmp_path / "op"
    assert (op_dir / "final_sft").resolve() == (op_dir / "round2" / "sft" / "merged").resolve()
    from pipeline.eval import load_eval_config

    ckpt = load_eval_config(str(ROOT / "configs/eval/measure.yaml")).planners["tiny-sft-onpolicy@0"]["checkpoint"]
    assert (op_dir / Path(ckpt).relative_to("runs/measure/onpolicy-s0")).is_dir()
    # one round: final_sft follows it (the copying recipe has rounds: 1)
    argv1 = [a if a != str(tmp_path / "op") else str(tmp_path / "op1") for a in argv]
    argv1[argv1.index("--rounds") + 1] = "1"
    assert op.main(argv1) == 0
    assert (tmp_path / "op1" / "final_sft").resolve() == (tmp_path / "op1" / "round1" / "sft" / "merged").resolve()
    # another start model: nothing is kept
    calls.clear()
    other = tmp_path / "sft1"
    other.mkdir()
    argv[1] = str(other)
    assert op.main(argv) == 0
    assert [c[1] for c in calls if c[0] == "relabel"] == [1, 2]
