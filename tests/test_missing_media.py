"""Missing media (docs/world.md, "Missing media"): the pre-flight lists the tasks whose media files are missing and
refuses before OUT is touched (exit 2, ids and count); --allow-missing-media / allow_missing_media: true runs them,
marked in task_meta, the summary and the report. Uses a few items of the vendored OmniGAIA file with a temp
media_root that holds the files of one task only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from collect.__main__ import main
from collect.loaders import load_omnigaia
from collect.run import MISSING_MEDIA_SHOWN, missing_media
from collect.tasks import AssetSpec, Task, Tracks
from collect.tools import ToolsConfig
from pipeline.report import render_report
from tests.fakes import FakeChatServer
from tests.helpers.loop_script import critic, needs_reply

ROOT = Path(__file__).resolve().parents[1]
OMNIGAIA = ROOT / "data/omnigaia/test_metadata.json"


@pytest.fixture
def omnigaia_setup(tmp_path):
    """Items 1-3 of OmniGAIA; the media of item 1 exist under the temp media root, items 2 and 3 have none. Real
    benchmark tasks have no gold chain, so the need parser and critic are a scripted endpoint (no needs declared)."""
    with FakeChatServer() as srv:
        srv.default("need_parser", needs_reply([]))
        srv.default("critic", critic())
        yield _omnigaia_setup(tmp_path, srv.base_url)


def _omnigaia_setup(tmp_path, base_url: str) -> tuple[Path, list[str]]:
    items = json.loads(OMNIGAIA.read_text())[:3]
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps(items))
    media = tmp_path / "media"
    for m in items[0]["omni_modal_input"]:
        (media / m["path"]).parent.mkdir(parents=True, exist_ok=True)
        (media / m["path"]).write_bytes(b"\0")
    cfg = {
        "name": "omnigaia-missing",
        "tasks": {"kind": "omnigaia", "path": str(meta), "media_root": str(media)},
        "split": "all",
        "tools": {"perception_backend": "annotations", "web_backend": "bm25"},
        "endpoints": {"fake": {"base_url": base_url, "model": "m", "max_retries": 0}},
        "roles": {"need_parser": "fake", "critic": "fake"},
        "harvest": {"enabled": False},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path, [f"omnigaia-{it['id']}" for it in items]


def test_missing_media_refuses_before_out_is_touched(omnigaia_setup, capsys):
    tmp, ids = omnigaia_setup
    out = tmp / "out"
    assert main(["--config", str(tmp / "cfg.yaml"), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "2 of 3 selected task(s) have missing media" in err and "--allow-missing-media" in err
    assert ids[1] in err and ids[2] in err and ids[0] not in err
    assert not out.exists()


def test_allow_missing_media_runs_them_marked(omnigaia_setup):
    tmp, ids = omnigaia_setup
    out = tmp / "out"
    assert main(["--config", str(tmp / "cfg.yaml"), "--out", str(out), "--no-progress", "--allow-missing-media"]) == 0
    recs = {r["task_id"]: r for r in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}
    assert set(recs) == set(ids)
    assert "missing_media" not in recs[ids[0]]["task_meta"]
    assert recs[ids[1]]["task_meta"]["missing_media"][0].endswith(
        ("audios/1Qs9w1XlJKE.wav", "images/000000263381.jpg")
    )
    assert len(recs[ids[2]]["task_meta"]["missing_media"]) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_missing_media"] == 2 and summary["missing_media_tasks"] == ids[1:]
    page = render_report("r", {"cell": summary}, {"cell": list(recs.values())})
    assert "missing media</th>" in page and "2 task(s) ran with missing media files" in page and ids[2] in page
    clean = render_report("r", {"cell": summary | {"n_missing_media": 0, "missing_media_tasks": []}}, {"cell": []})
    assert "ran with missing media" not in clean


def test_config_key_allows_too(omnigaia_setup):
    tmp, _ = omnigaia_setup
    cfg = yaml.safe_load((tmp / "cfg.yaml").read_text()) | {"allow_missing_media": True}
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp / "cfg.yaml"), "--out", str(tmp / "out"), "--no-progress"]) == 0


def test_refusal_names_at_most_n_ids_and_the_count(tmp_path, capsys):
    tasks = load_omnigaia(OMNIGAIA, media_root=tmp_path)[: MISSING_MEDIA_SHOWN + 5]
    meta = tmp_path / "meta.json"
    items = json.loads(OMNIGAIA.read_text())[: MISSING_MEDIA_SHOWN + 5]
    meta.write_text(json.dumps(items))
    cfg = {"tasks": {"kind": "omnigaia", "path": str(meta), "media_root": str(tmp_path)}, "split": "all"}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{len(tasks)} of {len(tasks)} selected" in err
    assert sum(t.id + "," in err or t.id + ";" in err or t.id + " " in err for t in tasks) == MISSING_MEDIA_SHOWN


def test_annotated_assets_need_no_file_unless_the_backend_reads_media(tmp_path):
    annotated = AssetSpec(
        id="v", type="video", path="nowhere.mp4", tracks=Tracks(frames=[{"t": 1, "description": "x"}])
    )
    bare = AssetSpec(id="w", type="video")
    t1 = Task(id="t1", question="q", answer="a", assets=[annotated])
    t2 = Task(id="t2", question="q", answer="a", assets=[bare])
    assert missing_media([t1, t2], ToolsConfig()) == {"t2": ["w (no path)"]}
    media = ToolsConfig(perception_backend="media", media_base_url="http://127.0.0.1:9/v1", media_model="m")
    assert missing_media([t1], media) == {"t1": ["nowhere.mp4"]}
    media.media_root = str(tmp_path)
    (tmp_path / "nowhere.mp4").write_bytes(b"\0")
    assert missing_media([t1], media) == {}


def test_eval_refuses_and_allows_like_collect(omnigaia_setup, capsys):
    """pipeline.eval runs each cell as a collect run: the same refusal, and the flag it names exists there too."""
    from pipeline.eval import main as eval_main

    tmp, ids = omnigaia_setup
    recipe = {"base": str(tmp / "cfg.yaml"), "split": "all", "planners": {"teacher": "offline"}}
    (tmp / "eval.yaml").write_text(yaml.safe_dump(recipe))
    argv = ["--config", str(tmp / "eval.yaml"), "--out", str(tmp / "ev")]
    assert eval_main(argv) == 2
    err = capsys.readouterr().err
    assert "2 of 3 selected task(s) have missing media" in err and "--allow-missing-media" in err
    assert eval_main([*argv, "--allow-missing-media"]) == 0
    summary = json.loads((tmp / "ev/summary.json").read_text())
    (cell,) = summary["cells"].values()
    assert cell["n_missing_media"] == 2 and cell["missing_media_tasks"] == ids[1:]
