"""Benchmark loaders: the real OmniGAIA file, missing fields/media, the WorldSense fixture, task files."""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

import pytest

from collect.loaders import load_omnigaia, load_worldsense
from collect.tasks import Task, TaskFileError, load_tasks, save_tasks

OMNIGAIA = Path(__file__).resolve().parents[1] / "data/omnigaia/test_metadata.json"
FIXTURES = Path(__file__).parent / "fixtures"


def test_all_omnigaia_items_load_with_level_counts_and_typed_assets(caplog):
    with caplog.at_level(logging.WARNING):
        tasks = load_omnigaia(OMNIGAIA)
    assert len(tasks) == 360
    assert collections.Counter(t.difficulty for t in tasks) == {"Easy": 122, "Medium": 160, "Hard": 78}
    assert all(t.assets and all(a.type in ("video", "audio", "image") for a in t.assets) for t in tasks)
    assert all(t.gold_chain == [] and t.source == "omnigaia" for t in tasks)
    # without a media root every file is reported missing, per task and in one summary warning
    assert all(t.meta["missing_media"] for t in tasks)
    assert sum("360 tasks have missing media" in r.getMessage() for r in caplog.records) == 1
    t1 = next(t for t in tasks if t.id == "omnigaia-1")
    assert t1.answer == "790" and t1.answer_type == "number" and t1.category == "Technology"
    assert any("time_spans" in t.meta for t in tasks)


def test_missing_optional_fields_and_media_never_crash(tmp_path, caplog):
    items = [
        {
            "id": 7,
            "question": "Q1?",
            "answer": "x",
            "Level": "Hard",
            "omni_modal_input": [
                {"type": "video", "id": "video_a", "path": "videos/a.mp4"},
                {"type": "audio", "id": "audio_b", "path": "audios/b.wav", "t_start": 0, "t_end": 9},
            ],
        },
        {
            "id": 8,
            "question": "Q2?",
            "answer": 12,
            "omni_modal_input": [{"type": "image", "path": "images/c.png"}],
            "sources": ["a plain string source"],
        },
        {"id": 9, "question": "Q3?", "answer": "y", "omni_modal_input": [{"type": "hologram", "path": "h.x"}]},
    ]
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(items))
    root = tmp_path / "media"
    (root / "videos").mkdir(parents=True)
    (root / "videos" / "a.mp4").write_bytes(b"x")
    with caplog.at_level(logging.WARNING):
        tasks = load_omnigaia(meta, media_root=root)
    a, b, c = tasks
    assert a.meta["missing_media"] == ["audios/b.wav"] and a.meta["time_spans"] == {"audio_b": [0.0, 9.0]}
    assert a.assets[0].path == str(root / "videos" / "a.mp4")
    assert b.difficulty == "Medium" and b.answer == "12" and b.assets[0].id == "c" and b.meta["task_type"] is None
    assert c.assets == [] and c.meta["skipped_inputs"]
    assert any("2 of 3 tasks have missing media" in r.getMessage() for r in caplog.records)


def test_worldsense_fixture_loads_options_answers_subtitles_and_disables_web():
    tasks = load_worldsense(
        FIXTURES / "worldsense_qa.json", video_root=None, subtitles_root=FIXTURES / "worldsense_subs"
    )
    assert [t.id for t in tasks] == [
        "worldsense-fxVid001-task0",
        "worldsense-fxVid001-task1",
        "worldsense-fxVid002-task0",
    ]
    t0 = tasks[0]
    assert t0.answer == "B" and t0.options[1] == "B. Carrots" and t0.answer_type == "multiple_choice"
    assert t0.category == "Daily Life" and t0.family == "Audio-Visual Temporal"
    assert "web_search" not in t0.to_context().tools()
    subs = t0.assets[0].tracks.subtitles
    assert [(s.start, s.end) for s in subs] == [(1.0, 4.5), (10.0, 13.25)] and "carrots" in subs[1].text
    assert tasks[2].assets[0].tracks.subtitles == [] and tasks[2].meta["missing_media"] == ["fxVid002.mp4"]


def test_malformed_task_file_error_names_file_task_and_field(tmp_path):
    good = Task(id="ok-1", question="q", answer="a")
    p = tmp_path / "tasks.jsonl"
    save_tasks([good], p)
    assert load_tasks(p) == [good]
    bad = good.model_dump() | {"id": "bad-7", "difficulty": "Impossible"}
    p.write_text(json.dumps(good.model_dump()) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TaskFileError) as e:
        load_tasks(p)
    msg = str(e.value)
    assert str(p) in msg and "bad-7" in msg and "difficulty" in msg
    pj = tmp_path / "tasks.json"
    pj.write_text(json.dumps([good.model_dump() | {"id": "x-2", "assets": [{"id": "v", "type": "smell"}]}]))
    with pytest.raises(TaskFileError, match=r"tasks\.json.*'x-2'.*assets\.0\.type"):
        load_tasks(pj)
    pj.write_text(json.dumps([{"id": "y-3", "answer": "a"}]))
    with pytest.raises(TaskFileError, match=r"'y-3'.*question"):
        load_tasks(pj)


def test_worldsense_subtitle_that_ends_before_it_starts_names_the_subtitle_file():
    subs = FIXTURES / "worldsense_subs_bad"
    with pytest.raises(TaskFileError) as e:
        load_worldsense(FIXTURES / "worldsense_qa.json", subtitles_root=subs)
    msg = str(e.value)
    assert str(subs / "fxVid001.srt") in msg and "subtitle 1" in msg and "worldsense-fxVid001-task" in msg
    assert "field end:" in msg and "10 s, before it starts (13.25 s)" in msg


def test_omnigaia_question_over_the_limit_names_file_item_and_task(tmp_path):
    items = json.loads(OMNIGAIA.read_text())[:3]
    items[2]["question"] = "Which year? " * 200_000  # 2.4 MB
    meta = tmp_path / "test_metadata.json"
    meta.write_text(json.dumps(items))
    with pytest.raises(TaskFileError) as e:
        load_omnigaia(meta)
    msg = str(e.value)
    assert str(meta) in msg and "item 2" in msg and f"'omnigaia-{items[2]['id']}'" in msg and "field question:" in msg
    assert "tasks.max_question_chars=16,000" in msg
    from collect.tasks import TaskLimits  # here: the module before the fix had none

    assert len(load_omnigaia(meta, limits=TaskLimits(max_question_chars=3_000_000))) == 3
    with pytest.raises(TaskFileError, match="tasks.max_file_bytes=1,000"):
        load_omnigaia(meta, limits=TaskLimits(max_file_bytes=1_000))


def test_benchmark_files_that_are_not_utf8_name_file_line_and_byte(tmp_path):
    meta = tmp_path / "test_metadata.json"
    meta.write_bytes(
        b'[\n {"id": 1, "question": "Caf\xe9?", "answer": "x"}\n]\n'
    )  # Latin-1, as a spreadsheet saves it
    with pytest.raises(TaskFileError) as e:
        load_omnigaia(meta)
    assert str(meta) in str(e.value) and "line 2, byte 28" in str(e.value) and "UTF-8" in str(e.value)
    qa = tmp_path / "worldsense_qa.json"
    qa.write_bytes(b'{"v": {"task0": {"question": "\xff", "candidates": ["A. x", "B. y"], "answer": "A"}}}')
    with pytest.raises(TaskFileError, match=r"worldsense_qa\.json: line 1, byte 31: not UTF-8 text"):
        load_worldsense(qa)
