"""Strict task files: every validation rule of collect.tasks, on hand-written files in tests/data/tasks/.

Each invalid file breaks exactly one rule; each test asserts that loading fails and that the message names the file,
the task and the field, so a rule that stopped being enforced (or a message that lost its context) fails here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collect.__main__ import main as collect_main
from collect.loaders import load_worldsense
from collect.tasks import TaskFileError, TaskSelectionError, load_tasks, select_tasks

DATA = Path(__file__).parent / "data" / "tasks"


def _error(name: str) -> str:
    path = DATA / name
    with pytest.raises(TaskFileError) as e:
        load_tasks(path)
    msg = str(e.value)
    assert str(path) in msg, msg
    return msg


def test_the_valid_file_loads_every_field():
    tasks = load_tasks(DATA / "valid.json")
    assert [t.id for t in tasks] == ["fx-open-1", "fx-mc-2", "fx-compute-3", "fx-unanswerable-4"]
    t0, mc, comp, un = tasks
    assert t0.answer_type == "number" and t0.split == "train" and t0.meta == {"entity": "Velmora Ferries"}
    assert t0.assets[0].tracks.subtitles[0].text == "Our next stop is Velmora Ferries."
    assert t0.assets[0].tracks.audio[0].kind == "event" and t0.gold_chain[1].depends_on == [0]
    assert mc.answer == "C" and len(mc.options) == 4 and "web_search" not in mc.allowed_tools
    assert [n.depends_on for n in comp.gold_chain] == [[], [0], [1], [1, 2]]
    assert un.answer_type == "unanswerable" and un.gold_chain[0].gold_value is None


def test_unknown_top_level_key_is_an_error_with_a_suggestion():
    msg = _error("unknown_key.json")
    assert "'fx-typo-1'" in msg and "field option: unknown key" in msg and "did you mean 'options'" in msg


def test_unknown_nested_key_names_its_path():
    msg = _error("unknown_nested_key.jsonl")
    assert "line 1" in msg and "'fx-nested-1'" in msg
    assert "field gold_chain.1.dependson: unknown key" in msg and "did you mean 'depends_on'" in msg


@pytest.mark.parametrize(
    "name,task_id,field",
    [
        ("bad_answer_type.json", "fx-enum-1", "answer_type"),
        ("bad_split.json", "fx-split-1", "split"),
        ("bad_need_role.json", "fx-role-1", "gold_chain.0.need_role"),
    ],
)
def test_enums_are_closed(name, task_id, field):
    msg = _error(name)
    assert f"'{task_id}'" in msg and f"field {field}:" in msg


def test_multiple_choice_gold_must_be_an_option_letter():
    msg = _error("mc_gold_not_option.json")
    assert "'fx-mc-1'" in msg and "field answer:" in msg and "A, B, C, D" in msg and "'E'" in msg


def test_multiple_choice_gold_given_as_option_text_points_at_its_letter():
    msg = _error("mc_gold_is_text.json")
    assert "'fx-mc-2'" in msg and "field answer:" in msg and "text of option B" in msg


def test_multiple_choice_needs_options_and_only_multiple_choice_has_them():
    msg = _error("mc_without_options.json")
    assert "'fx-mc-3'" in msg and "field options:" in msg and "at least 2" in msg
    msg = _error("options_not_mc.json")
    assert "'fx-mc-4'" in msg and "field options:" in msg and "only a multiple_choice task" in msg


def test_depends_on_must_be_in_range():
    msg = _error("depends_out_of_range.json")
    assert "'fx-dep-1'" in msg and "field gold_chain.1.depends_on:" in msg and "index 2 is out of range" in msg


def test_depends_on_must_be_acyclic():
    msg = _error("depends_cycle.json")
    assert "'fx-dep-2'" in msg and "depends_on:" in msg and "cycle 0 -> 2 -> 1 -> 0" in msg
    msg = _error("depends_self.json")
    assert "'fx-dep-3'" in msg and "field gold_chain.0.depends_on:" in msg and "depends on itself" in msg


def test_allowed_tools_must_be_known_tool_names():
    msg = _error("unknown_tool.json")
    assert "'fx-tool-1'" in msg and "field allowed_tools.1:" in msg and "'web_serch'" in msg and "web_search" in msg


def test_asset_ids_are_unique_within_a_task():
    msg = _error("duplicate_asset.json")
    assert "'fx-asset-1'" in msg and "field assets.1.id:" in msg and "duplicate asset id 'video_1'" in msg


def test_a_top_level_object_says_expected_a_list_of_tasks():
    msg = _error("top_level_object.json")
    assert "expected a list of tasks" in msg and "not valid JSON" not in msg


def test_an_empty_file_is_an_error():
    assert "contains no tasks" in _error("empty.jsonl")


def test_a_one_line_jsonl_task_is_still_a_task_file(tmp_path):
    p = tmp_path / "one.jsonl"
    p.write_text(json.dumps({"id": "one", "question": "q?", "answer": "a"}) + "\n")
    assert [t.id for t in load_tasks(p)] == ["one"]


# ---- selection ------------------------------------------------------------------------------------------------------


def test_select_tasks_split_and_limit():
    tasks = load_tasks(DATA / "valid.json")
    assert [t.id for t in select_tasks(tasks, "train", None, "f")] == ["fx-open-1", "fx-compute-3"]
    assert [t.id for t in select_tasks(tasks, "test", 1, "f")] == ["fx-mc-2"]
    assert len(select_tasks(tasks, "all", None, "f")) == len(select_tasks(tasks, None, 99, "f")) == 4


@pytest.mark.parametrize(
    "split,limit,needle",
    [
        ("dev", None, "split 'dev' selects no tasks from valid.json (its splits: test: 2, train: 2)"),
        ("validation", None, "unknown split 'validation'"),
        ("train", 0, "limit must be a positive integer"),
        ("train", -1, "limit must be a positive integer"),
        (None, -3, "got -3"),
    ],
)
def test_a_selection_of_nothing_is_an_error_never_everything(split, limit, needle):
    tasks = load_tasks(DATA / "valid.json")
    with pytest.raises(TaskSelectionError) as e:
        select_tasks(tasks, split, limit, "valid.json")
    assert needle in str(e.value)


def test_collect_cli_exits_2_on_an_empty_split_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    rc = collect_main(["--tasks", str(DATA / "valid.json"), "--split", "dev", "--out", str(out), "--no-progress"])
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "split 'dev' selects no tasks" in err and str(DATA / "valid.json") in err


def test_collect_cli_exits_2_on_a_strict_schema_error(tmp_path, capsys):
    out = tmp_path / "out"
    rc = collect_main(["--tasks", str(DATA / "unknown_key.json"), "--split", "all", "--out", str(out)])
    assert rc == 2 and not out.exists()
    assert "field option: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_collect_cli_rejects_a_limit_below_one(value, capsys):
    with pytest.raises(SystemExit) as e:
        collect_main(["--limit", value])
    assert e.value.code == 2 and "positive integer" in capsys.readouterr().err


def test_worldsense_answer_outside_the_candidates_names_file_and_task(tmp_path):
    qa = {"vidX": {"duration": 30, "task0": {"question": "q?", "candidates": ["A. x", "B. y"], "answer": "D"}}}
    p = tmp_path / "worldsense_qa.json"
    p.write_text(json.dumps(qa))
    with pytest.raises(TaskFileError) as e:
        load_worldsense(p)
    msg = str(e.value)
    assert str(p) in msg and "worldsense-vidX-task0" in msg and "field answer:" in msg


@pytest.mark.parametrize(
    "name,task_id,field,needle",
    [
        ("empty_gold.json", "fx-gold-1", "answer", "the gold answer is empty"),
        ("blank_gold_value.jsonl", "fx-gold-2", "gold_chain.0.gold_value", "blank"),
        ("alt_bad_kind.json", "fx-alt-1", "meta.alt_values.1.0.kind", "'outdated' or 'conflicting'"),
        ("alt_bad_index.json", "fx-alt-2", "meta.alt_values.2", "not a need index of gold_chain (0..1)"),
        ("alt_is_gold.json", "fx-alt-3", "meta.alt_values.1.0.value", "is the need's gold_value"),
        ("unresolved_with_gold.json", "fx-unres-1", "gold_chain.1.unresolved_conflict", "has none (null)"),
        ("unresolved_one_side.json", "fx-unres-2", "gold_chain.1.unresolved_conflict", "at least two"),
        ("unresolved_with_answer.json", "fx-unres-3", "gold_chain.1.unresolved_conflict", "must be 'insufficient'"),
    ],
)
def test_gold_values_alt_values_and_the_unresolved_marking_are_checked(name, task_id, field, needle):
    msg = _error(name)
    assert f"'{task_id}'" in msg and f"field {field}:" in msg and needle in msg, msg


def test_the_unresolved_marking_loads_and_stays_out_of_dumps_when_unset():
    (t,) = [t for t in load_tasks(Path(__file__).parent / "data/spoken/tasks.jsonl") if t.id == "sp-10-tower-height"]
    assert t.gold_chain[1].unresolved_conflict and t.gold_chain[1].gold_value is None
    assert t.model_dump()["gold_chain"][1]["unresolved_conflict"] is True
    assert "unresolved_conflict" not in t.model_dump()["gold_chain"][0]  # unset: the key is not written
