"""Evaluation end to end: a tiny checkpoint served by serve.local is swapped in as the planner through the real openai
client; a short eval writes a complete summary and a self-contained report that parses."""

from __future__ import annotations

import dataclasses
import json
import shutil
from html.parser import HTMLParser

import pytest
import yaml

from collect.actions import offered_refs
from collect.config import EndpointConfig, load_config
from collect.ledger import OUTCOMES
from collect.run import RunDirError
from pipeline.eval import format_table, load_eval_config, run_eval
from pipeline.planners import checkpoint_fingerprint, parse_planner_arg
from tests.helpers.loop_script import fake_checkpoint

SUMMARY_KEYS = {
    "n_tasks",
    "accuracy",
    "ci95",
    "by_difficulty",
    "by_category",
    "outcomes",
    "accuracy_by_outcome",
    "avg_tool_calls",
    "tool_distribution",
    "planner_prompt_tokens_by_step",
    "closure_audit",
    "valid_action_rate",
}


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("src", "href") and v and v.startswith(("http://", "https://", "//")):
                self.external.append(v)

    def handle_data(self, data):
        self.text.append(data)


@pytest.mark.slow
def test_local_server_planner_swapped_into_runtime_gives_complete_summary_and_report(tmp_path, tiny_model):
    ckpt = shutil.copytree(tiny_model, tmp_path / tiny_model.name)  # touched at the end
    cfg_path = tmp_path / "eval.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "base": "configs/collect/embedded.yaml",
                "name": "e2e",
                "split": "test",
                "limit": 2,
                "planners": {"teacher": "offline", "tiny": {"checkpoint": str(ckpt)}},
                "arms": ["ledger", "react"],
                "planner_endpoint": {"max_tokens": 24, "timeout_s": 60.0, "max_retries": 1},
            }
        )
    )
    out = tmp_path / "eval"
    summary = run_eval(load_eval_config(str(cfg_path)), out)
    cells = summary["cells"]
    assert set(cells) == {
        "teacher__ledger__annotations",
        "teacher__react__annotations",
        "tiny__ledger__annotations",
        "tiny__react__annotations",
    }
    for name, s in cells.items():
        assert SUMMARY_KEYS <= set(s), name
        assert s["n_tasks"] == 2 and sum(s["outcomes"].values()) == 2
        assert set(s["outcomes"]) == set(OUTCOMES)
    tiny = cells["tiny__ledger__annotations"]
    # the served planner really answered: prompt tokens were counted by the server for every planner call
    assert tiny["planner_calls"] > 0 and all(v > 0 for v in tiny["planner_prompt_tokens_by_step"].values())
    traj = (out / "cells/tiny__ledger__annotations/trajectories.jsonl").read_text().splitlines()
    assert {json.loads(x)["models"]["planner"] for x in traj} == {tiny_model.name}  # the served model, not the teacher
    assert cells["teacher__ledger__annotations"]["accuracy"] == 1.0  # the offline reference still closes its tasks
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["cells"].keys() == cells.keys()
    table = format_table(summary)
    assert "tiny__ledger__annotations" in table

    html = (out / "report.html").read_text()
    p = _Collect()
    p.feed(html)
    assert p.external == [], "the report must open from disk with no network"
    assert p.tags.count("svg") >= 2 and "table" in p.tags and "details" in p.tags
    text = " ".join(p.text)
    needles = ("planner prompt tokens per call", "Per-task viewer", "planner saw", "ledger diff", "outcomes")
    for needle in (*needles, "time window copied"):
        assert needle in text, needle

    # run again into the same OUT (a killed eval resumed, `make demo` twice): the checkpoint is served on another
    # port, which must not make its cells "another configuration"; every task is already done, nothing changes
    cell = out / "cells/tiny__ledger__annotations"
    before = (cell / "trajectories.jsonl").read_bytes()
    again = run_eval(load_eval_config(str(cfg_path)), out)
    assert (cell / "trajectories.jsonl").read_bytes() == before
    assert again["cells"]["tiny__ledger__annotations"]["accuracy"] == tiny["accuracy"]
    meta = json.loads((cell / "run_config.json").read_text())
    assert meta["config"]["endpoints"]["planner"]["served_from"] == checkpoint_fingerprint(ckpt)
    # the checkpoint rewritten in place (trained again): its old cells are refused, not mixed with new runs
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + "\n")
    assert checkpoint_fingerprint(ckpt) != meta["config"]["endpoints"]["planner"]["served_from"]
    with pytest.raises(RunDirError, match="another configuration"):
        run_eval(load_eval_config(str(cfg_path)), out)


def test_a_served_checkpoints_port_is_not_part_of_the_run_config_hash():
    """pipeline.eval and pipeline.relabel serve a checkpoint on a fresh port each run; the run's config hash (what a
    rerun checks before resuming an OUT) must follow the checkpoint, while a named endpoint's URL stays part of it."""
    base = load_config("configs/collect/embedded.yaml")

    def with_planner(**ep) -> str:
        c = dataclasses.replace(base, endpoints={**base.endpoints, "planner": EndpointConfig(model="m", **ep)})
        return c.hash()

    served = with_planner(base_url="http://127.0.0.1:4100/v1", served_from="abc")
    assert served == with_planner(base_url="http://127.0.0.1:4200/v1", served_from="abc")
    assert served != with_planner(base_url="http://127.0.0.1:4100/v1", served_from="abd")
    assert with_planner(base_url="http://h:1/v1") != with_planner(base_url="http://h:2/v1")
    assert with_planner(base_url="http://h:1/v1") != served


def test_planner_argument_forms(tmp_path):
    assert parse_planner_arg("offline") == "offline"
    assert parse_planner_arg("http://h:8000/v1#qwen")["endpoint"]["model"] == "qwen"
    assert parse_planner_arg(str(tmp_path)) == {"checkpoint": str(tmp_path)}
    with pytest.raises(ValueError, match="neither"):
        parse_planner_arg(str(tmp_path / "missing"))


def test_eval_config_with_broken_yaml_is_a_clear_error(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("split: test\nname: seed 1, dev split: round 1\n")  # an unquoted colon in a value
    with pytest.raises(ValueError, match="YAML syntax error at line 2"):
        load_eval_config(str(p))
    p.write_text("- teacher\n")
    with pytest.raises(ValueError, match="expected a mapping of config keys"):
        load_eval_config(str(p))


def test_eval_config_rejects_unknown_keys_and_bad_planners(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump({"planerz": {}}))
    with pytest.raises(ValueError, match="planerz"):
        load_eval_config(str(p))
    p.write_text(yaml.safe_dump({"planners": {"x": {"weights": "y"}}}))
    with pytest.raises(ValueError, match="planners.x"):
        load_eval_config(str(p))


def test_a_served_checkpoint_takes_per_planner_endpoint_overrides(tmp_path, monkeypatch):
    import pipeline.planners
    from pipeline.planners import planner_endpoint

    class FakeServer:
        base_url = "http://127.0.0.1:1/v1"

        def __init__(self, ckpt):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(pipeline.planners, "LocalServer", FakeServer)
    fake_checkpoint(tmp_path)
    defaults = {"max_tokens": 640, "timeout_s": 120.0, "max_retries": 2}
    with planner_endpoint({"checkpoint": str(tmp_path), "endpoint": {"max_tokens": 64}}, defaults) as ep:
        assert (ep.max_tokens, ep.timeout_s, ep.base_url) == (64, 120.0, FakeServer.base_url)
    with planner_endpoint({"checkpoint": str(tmp_path)}, defaults) as ep:
        assert ep.max_tokens == 640
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump({"planners": {"x": {"checkpoint": "d", "endpoint": {"base_url": "http://h"}}}}))
    with pytest.raises(ValueError, match="serve.local"):
        load_eval_config(str(p))


def test_per_planner_runtime_overrides_reach_only_that_planners_cells(tmp_path):
    from tests.fakes import FakeChatServer, text

    p = tmp_path / "e.yaml"
    bad = {"endpoint": {"base_url": "u", "model": "m"}, "runtime": {"t": 1}}
    p.write_text(yaml.safe_dump({"planners": {"x": bad}}))
    with pytest.raises(ValueError, match=r"planners.x.runtime.*\['t'\]"):
        load_eval_config(str(p))
    p.write_text(yaml.safe_dump({"planners": {"x": {"checkpoint": "d", "runtime": {"arm": "react"}}}}))
    with pytest.raises(ValueError, match="planners.x.runtime"):
        load_eval_config(str(p))
    with FakeChatServer() as srv:
        srv.default("planner", text("I will not call a tool."))  # every reply is rejected
        ep = {"base_url": srv.base_url, "model": "fake", "max_retries": 0}
        cfg = {
            "split": "test",
            "limit": 1,
            "planners": {
                "paper": {"endpoint": ep, "runtime": {"max_steps": 3, "references": []}},
                "refs": {"endpoint": ep, "runtime": {"max_steps": 2}},
            },
        }
        p.write_text(yaml.safe_dump(cfg))
        summary = run_eval(load_eval_config(str(p)), tmp_path / "out")
    for name, steps, offered in (("paper", 3, ()), ("refs", 2, ("need", "window", "focus"))):
        cell = summary["cells"][f"{name}__ledger__annotations"]
        assert cell["outcomes"]["budget_exhausted"] == 1 and cell["valid_action_rate"] == 0.0
        cell_dir = tmp_path / "out" / "cells" / f"{name}__ledger__annotations"
        rec = json.loads((cell_dir / "trajectories.jsonl").read_text())
        assert len(rec["steps"]) == steps
        assert {offered_refs(s["planner_input"]["messages"]) for s in rec["steps"]} == {offered}


def test_merging_evals_run_apart_pools_them_as_one_config_would(tmp_path):
    """Two evals of the same planner name (e.g. one per seed, on two nodes) merged == one eval listing both."""
    from collect.trajectory import read_trajectories
    from pipeline.eval import main, merge_evals

    def cfg(planners, split="test"):
        p = tmp_path / f"cfg{len(list(tmp_path.iterdir()))}.yaml"
        p.write_text(yaml.safe_dump({"split": split, "limit": 3, "planners": planners}))
        return load_eval_config(str(p))

    a = run_eval(cfg({"teacher": "offline"}), tmp_path / "a")
    run_eval(cfg({"teacher": "offline", "other": "offline"}), tmp_path / "b")
    one = run_eval(cfg({"teacher@0": "offline", "teacher@1": "offline", "other": "offline"}), tmp_path / "one")
    assert main(["--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert set(merged["cells"]) == {
        "teacher@in0__ledger__annotations",
        "teacher@in1__ledger__annotations",
        "other__ledger__annotations",
    }
    assert merged["merged_from"] == [str(tmp_path / "a"), str(tmp_path / "b")]
    src = merged["cells"]["teacher@in1__ledger__annotations"]["source"]
    assert src == str(tmp_path / "b" / "cells" / "teacher__ledger__annotations")
    for cell in merged["cells"]:  # each cell is an ordinary collect run, copied
        assert len(read_trajectories(tmp_path / "m" / "cells" / cell / "trajectories.jsonl")) == 3
    pooled, want = merged["planners"], one["planners"]
    assert set(pooled) == set(want) == {"teacher__ledger__annotations", "other__ledger__annotations"}
    for key in want:  # every pooled figure but the cell names
        assert {k: v for k, v in pooled[key].items() if k != "seeds"} == {
            k: v for k, v in want[key].items() if k != "seeds"
        }
    assert pooled["teacher__ledger__annotations"]["n_task_runs"] == 6
    assert pooled["teacher__ledger__annotations"]["n_seeds"] == 2
    assert a["cells"]["teacher__ledger__annotations"]["n_tasks"] == 3
    assert (tmp_path / "m" / "report.html").stat().st_size > 0
    # bad inputs are refused with the reason
    run_eval(cfg({"teacher": "offline"}, split="dev"), tmp_path / "dev")
    with pytest.raises(ValueError, match="differ in split"):
        merge_evals([tmp_path / "a", tmp_path / "dev"], tmp_path / "m2")
    with pytest.raises(FileNotFoundError, match="summary.json"):
        merge_evals([tmp_path / "a", tmp_path / "nowhere"], tmp_path / "m3")
    with pytest.raises(ValueError, match="not a pipeline.eval summary"):  # a collect run's OUT, not an eval's
        merge_evals([tmp_path / "a", tmp_path / "a" / "cells" / "teacher__ledger__annotations"], tmp_path / "m4")
    with pytest.raises(ValueError, match="one of the inputs"):
        merge_evals([tmp_path / "a", tmp_path / "b"], tmp_path / "b")
    assert main(["--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 2


def _runs(out, cell) -> dict[str, str]:
    """A cell's run records by task, without what differs between two runs of the same planner (call ids, times)."""
    import re

    from collect.trajectory import read_trajectories

    def norm(t: dict) -> str:
        steps = [{k: v for k, v in s.items() if k != "latency_s"} for s in t["steps"]]
        keep = {k: t[k] for k in ("outcome", "answer", "correct", "final_ledger_hash", "model_errors")}
        return re.sub(r'"call_[0-9a-f]+"', '"call"', json.dumps({**keep, "steps": steps}, sort_keys=True))

    return {t["task_id"]: norm(t) for t in read_trajectories(out / "cells" / cell / "trajectories.jsonl")}


def _timeless(d):
    if isinstance(d, dict):
        return {k: _timeless(v) for k, v in d.items() if "wall" not in k and "latency" not in k and k != "usage"}
    return [_timeless(v) for v in d] if isinstance(d, list) else d


@pytest.mark.slow
def test_planners_evaluated_in_processes_give_what_one_process_gives(tmp_path):
    """planner_processes: 2 evaluates the planners two at a time in spawned processes: the same cells in config
    order, the same run records (bar call ids and times) and the same pooled figures as one process; a planner that
    fails does not stop the others and is named in the error; bad values are refused."""
    from pipeline.eval import main
    from serve.local import free_port
    from tests.fakes import FakeChatServer, text

    def cfg(planners, n, name):
        p = tmp_path / f"{name}.yaml"
        body = {"split": "test", "limit": 3, "planners": planners, "planner_processes": n}
        p.write_text(yaml.safe_dump(body, sort_keys=False))  # the planners in this order
        return load_eval_config(str(p))

    with FakeChatServer() as srv:
        srv.default("planner", text("I will not call a tool."))  # every reply is rejected: budget exhausted
        ep = {"base_url": srv.base_url, "model": "fake", "max_retries": 0}
        planners = {"teacher": "offline", "refuser": {"endpoint": ep, "runtime": {"max_steps": 2}}, "other": "offline"}
        one = run_eval(cfg(planners, 1, "one"), tmp_path / "one")
        n_one = len(srv.role_requests("planner"))
        two = run_eval(cfg(planners, 2, "two"), tmp_path / "two")
        assert len(srv.role_requests("planner")) == 2 * n_one == 2 * 3 * 2  # the child process asked the server
    assert list(two["cells"]) == list(one["cells"]) == [f"{p}__ledger__annotations" for p in planners]
    for cell in one["cells"]:
        assert _runs(tmp_path / "two", cell) == _runs(tmp_path / "one", cell), cell
        assert len(_runs(tmp_path / "two", cell)) == 3
    assert _timeless(two["planners"]) == _timeless(one["planners"])
    assert _timeless(two["cells"]) == _timeless(one["cells"])
    assert two["cells"]["refuser__ledger__annotations"]["outcomes"]["budget_exhausted"] == 3
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["cells"].keys() == two["cells"].keys()

    # a planner whose endpoint is down fails in its process; the other planner's cell is finished on disk
    dead = {"endpoint": {"base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "x", "max_retries": 0}}
    with pytest.raises(ValueError, match=r"planner dead: .*unreachable"):
        run_eval(cfg({"dead": dead, "teacher": "offline"}, 2, "fail"), tmp_path / "fail")
    assert len(_runs(tmp_path / "fail", "teacher__ledger__annotations")) == 3
    assert not (tmp_path / "fail" / "summary.json").exists()
    # a missing checkpoint is refused before any process starts
    with pytest.raises(FileNotFoundError, match="planner gone: checkpoint not found"):
        run_eval(cfg({"teacher": "offline", "gone": {"checkpoint": str(tmp_path / "nope")}}, 2, "x"), tmp_path / "x")
    assert not (tmp_path / "x" / "cells").exists()
    broken = cfg({"teacher": "offline", "other": "offline"}, 2, "broken")
    broken.base = str(tmp_path / "no-such-base.yaml")  # so is a base collect config that does not load
    with pytest.raises(FileNotFoundError, match=r"^config file not found: .*no-such-base"):  # not a planner's error
        run_eval(broken, tmp_path / "b")
    assert not (tmp_path / "b" / "cells").exists()
    for bad in (0, -1, "two", 1.5):
        with pytest.raises(ValueError, match="planner_processes"):
            cfg({"teacher": "offline"}, bad, "bad")
    assert cfg({"teacher": "offline"}, "auto", "auto").planner_processes == "auto"
    assert cfg({"teacher": "offline"}, "3", "digits").planner_processes == 3
    argv = ["--config", str(tmp_path / "one.yaml"), "--planner-processes", "0", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
