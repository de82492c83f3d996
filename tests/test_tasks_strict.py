"""Strict task files: every validation rule of collect.tasks, on hand-written files in tests/data/tasks/.

Each invalid file breaks exactly one rule; each test asserts that loading fails and that the message names the file,
the task and the field, so a rule that stopped being enforced (or a message that lost its context) fails here.
"""

from __future__ import annotations

import dataclasses
import json
import time
import tracemalloc
from pathlib import Path

import pytest

from collect.__main__ import main as collect_main
from collect.loaders import load_worldsense
from collect.tasks import TaskFileError, TaskSelectionError, load_corpus, load_tasks, select_tasks

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


# ---- issue 52: numbers JSON cannot hold are refused at load, naming file, task and field ---------------------------
_TASK = {"id": "fx-nan-1", "question": "q?", "answer": "a"}


@pytest.mark.parametrize(
    "asset_json,field",
    [
        ('{"id": "v1", "type": "video", "duration": NaN}', "assets.0.duration"),
        ('{"id": "v1", "type": "video", "duration": -Infinity}', "assets.0.duration"),
        ('{"id": "v1", "type": "video", "duration": 1e400}', "assets.0.duration"),  # json reads it as inf
        (
            '{"id": "v1", "type": "video", "tracks": {"subtitles": [{"start": 0, "end": Infinity, "text": "x"}]}}',
            "assets.0.tracks.subtitles.0.end",
        ),
    ],
)
def test_a_non_finite_number_in_a_task_is_refused_naming_file_task_and_field(tmp_path, asset_json, field):
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(_TASK)[:-1] + ', "assets": [' + asset_json + "]}\n")
    with pytest.raises(TaskFileError) as e:
        load_tasks(p)  # before: loaded, and the run wrote the bare NaN / Infinity into trajectories.jsonl
    msg = str(e.value)
    assert str(p) in msg and "'fx-nan-1'" in msg and f"field {field}:" in msg and "finite" in msg, msg


def test_a_non_finite_number_in_task_meta_is_refused_naming_its_path(tmp_path):
    p = tmp_path / "tasks.json"
    p.write_text(json.dumps([_TASK])[:-2] + ', "meta": {"scores": [1, NaN]}}]')
    with pytest.raises(TaskFileError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert str(p) in msg and "'fx-nan-1'" in msg and "field meta.scores.1:" in msg and "finite" in msg, msg


def test_benchmark_loaders_refuse_non_finite_numbers_naming_file_task_and_field(tmp_path):
    from collect.loaders import load_omnigaia

    ws = tmp_path / "worldsense_qa.json"
    ws.write_text(
        '{"vidX": {"duration": NaN, "task0": {"question": "q?", "candidates": ["A. x", "B. y"], "answer": "A"}}}'
    )
    with pytest.raises(TaskFileError) as e:
        load_worldsense(ws)
    msg = str(e.value)
    assert str(ws) in msg and "worldsense-vidX-task0" in msg and "field assets.0.duration:" in msg, msg
    og = tmp_path / "test_metadata.json"
    item = '{"id": 3, "question": "q?", "answer": "a", "omni_modal_input": [{"type": "video", "path": "v.mp4", '
    og.write_text("[" + item + '"time_span": [0, Infinity]}]}]')
    with pytest.raises(TaskFileError) as e:
        load_omnigaia(og)
    msg = str(e.value)
    assert str(og) in msg and "task id 3" in msg and "field meta.time_spans.v.1:" in msg, msg


# ---- issue 52 class 9: unchecked and unbounded inputs ---------------------------------------------------------------


def test_task_ids_that_differ_only_by_case_are_refused():
    msg = _error("id_case_twin.jsonl")
    assert "line 2" in msg and "'FX-Case-1'" in msg and "field id:" in msg and "'fx-case-1' (line 1)" in msg


def test_task_ids_with_surrounding_whitespace_are_refused():
    msg = _error("id_trailing_space.json")
    assert "item 1" in msg and "'fx-space-1 '" in msg and "field id:" in msg and "whitespace" in msg


def test_a_subtitle_that_ends_before_it_starts_is_refused(tmp_path):
    msg = _error("subtitle_ends_before_start.json")
    assert "'fx-subs-1'" in msg and "field assets.0.tracks.subtitles.1.end:" in msg and "8.5" in msg and "12" in msg
    # the same rule for the other timed tracks
    task = json.loads((DATA / "subtitle_ends_before_start.json").read_text())[0]
    tracks = task["assets"][0]["tracks"]
    tracks["audio"] = [{"start": 3.0, "end": 2.0, "text": "a horn"}]
    tracks["clips"] = [{"start": 9.0, "end": 1.0, "caption": "the stage"}]
    for track in ("audio", "clips"):
        one = json.loads(json.dumps(task))
        one["assets"][0]["tracks"] = {track: tracks[track]}
        (tmp_path / "t.json").write_text(json.dumps([one]))
        with pytest.raises(TaskFileError, match=f"field assets.0.tracks.{track}.0.end: "):
            load_tasks(tmp_path / "t.json")


def test_duplicate_document_ids_inside_a_task_are_refused():
    msg = _error("duplicate_document_id.json")
    assert "'fx-docs-1'" in msg and "field documents.1.id:" in msg and "duplicate document id 'kelmar-1'" in msg


def test_a_compute_formula_may_only_use_the_values_of_its_dependencies():
    msg = _error("compute_unknown_value.json")
    assert "'fx-calc-1'" in msg and "field gold_chain.3.query_focus:" in msg
    assert "v3" in msg and "depends_on [1, 2]" in msg


def test_a_compute_formula_names_only_known_helpers():
    msg = _error("compute_unknown_helper.json")
    assert "'fx-calc-2'" in msg and "field gold_chain.2.query_focus:" in msg and "'to_number'" in msg
    assert "to_num" in msg  # the helpers it can use


def test_a_compute_formula_may_bind_its_own_names(tmp_path):
    task = json.loads((DATA / "compute_unknown_helper.json").read_text())[0]
    focus = "compute: fmt(max(x * k for x in [to_num(v1)] for k in (0.621371,))) or (lambda y: y)(0)"
    task["gold_chain"][2]["query_focus"] = focus
    (tmp_path / "t.json").write_text(json.dumps([task]))
    assert load_tasks(tmp_path / "t.json")[0].gold_chain[2].query_focus == focus
    task["gold_chain"][2]["query_focus"] = "compute: to_num(v1) *"
    (tmp_path / "t.json").write_text(json.dumps([task]))
    with pytest.raises(TaskFileError, match="field gold_chain.2.query_focus: .* not a Python expression"):
        load_tasks(tmp_path / "t.json")


def test_every_formula_of_the_embedded_world_and_the_external_example_passes():
    from collect.world import load_world

    tasks = load_world(seed=0).tasks + load_tasks(Path(__file__).parent / "data" / "external" / "tasks.json")
    formulas = [n.query_focus for t in tasks for n in t.gold_chain if n.query_focus.startswith("compute:")]
    assert len(formulas) > 60  # the check ran on real formulas (it runs at Task construction)


def test_a_question_over_the_limit_is_refused_with_the_setting_to_change(tmp_path):
    p = tmp_path / "big.jsonl"
    rec = {"id": "fx-big-1", "question": "Why? " * 400_000, "answer": "a"}  # 2 MB
    p.write_text(json.dumps({"id": "fx-small-1", "question": "q?", "answer": "a"}) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(TaskFileError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert str(p) in msg and "line 2" in msg and "'fx-big-1'" in msg and "field question:" in msg
    assert "2,000,000 characters" in msg and "tasks.max_question_chars=16,000" in msg
    from collect.tasks import TaskLimits  # here: the module before the fix had none

    assert len(load_tasks(p, TaskLimits(max_question_chars=2_000_000))) == 2  # configurable


def test_a_huge_task_file_is_refused_before_it_is_read(tmp_path):
    p = tmp_path / "huge.jsonl"
    with p.open("wb") as f:  # 1 GiB, sparse: costs no disk
        f.truncate(2**30)
    t = time.monotonic()
    with pytest.raises(TaskFileError) as e:
        load_tasks(p)
    assert time.monotonic() - t < 1.0
    assert str(p) in str(e.value) and "1,073,741,824 bytes" in str(e.value) and "tasks.max_file_bytes" in str(e.value)


def test_a_huge_line_is_refused_after_reading_at_most_the_record_limit(tmp_path):
    p = tmp_path / "line.jsonl"
    first = json.dumps({"id": "fx-ok-1", "question": "q?", "answer": "a"})
    p.write_bytes(first.encode() + b"\n" + b'{"id": "fx-long-2", "question": "' + b"x" * (48 * 2**20) + b'"}\n')
    tracemalloc.start()
    t = time.monotonic()
    try:
        with pytest.raises(TaskFileError) as e:
            load_tasks(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t < 5.0
    assert peak < 24 * 2**20, f"peak {peak:,} bytes for a 48 MiB line"  # the 8 MiB record limit, not the line
    msg = str(e.value)
    assert str(p) in msg and "line 2" in msg and "tasks.max_record_bytes=8,388,608" in msg


def test_a_corpus_that_is_not_utf8_names_the_file_and_line():
    p = DATA / "latin1.corpus.jsonl"
    with pytest.raises(TaskFileError) as e:
        load_corpus(p)
    msg = str(e.value)
    assert str(p) in msg and "line 1" in msg and "UTF-8" in msg


def test_a_corpus_document_over_the_limit_is_refused(tmp_path):
    p = tmp_path / "c.corpus.jsonl"
    p.write_text(json.dumps({"id": "d1", "url": "u", "text": "ok"}) + "\n"
                 + json.dumps({"id": "d2", "url": "u", "title": "t", "text": "y" * 200_000}) + "\n")  # fmt: skip
    with pytest.raises(TaskFileError) as e:
        load_corpus(p)
    msg = str(e.value)
    assert str(p) in msg and "line 2" in msg and "'d2'" in msg and "tasks.max_document_chars=100,000" in msg
    from collect.tasks import TaskLimits  # here: the module before the fix had none

    assert len(load_corpus(p, TaskLimits(max_document_chars=300_000))) == 2
    # a task's own documents have the same limit
    task = {"id": "fx-doc-1", "question": "q?", "answer": "a", "documents": [{"url": "u", "text": "z" * 100_001}]}
    (tmp_path / "t.json").write_text(json.dumps([task]))
    with pytest.raises(TaskFileError, match=r"'fx-doc-1': field documents.0.text: 100,001 characters"):
        load_tasks(tmp_path / "t.json")


def test_the_limits_are_task_source_settings_and_stay_out_of_the_config_hash(tmp_path, capsys):
    from collect.config import CollectConfig, TaskSource

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"tasks: {{kind: file, path: {DATA / 'valid.json'}, max_question_chars: 50}}\n")
    out = tmp_path / "out"
    rc = collect_main(["--config", str(cfg), "--split", "all", "--out", str(out), "--no-progress"])
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "'fx-open-1'" in err and "field question:" in err and "tasks.max_question_chars=50" in err
    base = CollectConfig(tasks=TaskSource(kind="file", path=str(DATA / "valid.json")))
    tight = CollectConfig(tasks=TaskSource(kind="file", path=str(DATA / "valid.json"), max_question_chars=50))
    assert base.hash() == tight.hash()  # a limit decides whether a task loads, not what its trajectory means
    from collect.run import load_task_list

    assert len(load_task_list(dataclasses.replace(base, split="all"))) == 4  # the same file, default limits: loads
    with pytest.raises(TaskFileError, match="tasks.max_question_chars=50"):
        load_task_list(dataclasses.replace(tight, split="all"))


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
