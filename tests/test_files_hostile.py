"""Run files under abuse (issue 16 class 9): torn lines anywhere, a second writer on the same OUT, a missing or empty
run_config.json. Every case is refused with exit 2 and a message naming the file, or read with the one torn-line
policy (skip with a warning, count it); never a traceback, never doubled or mixed trajectories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collect.__main__ import main as collect_main
from collect.harvest import harvest
from collect.run import lock_out, unlock_out

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("files") / "out"
    rc = collect_main(["--out", str(out), "--split", "train", "--limit", "4", "--no-harvest", "--no-progress"])
    assert rc == 0
    return out


def _lines(out: Path) -> list[bytes]:
    return (out / "trajectories.jsonl").read_bytes().splitlines(keepends=True)


def test_harvest_skips_a_torn_line_in_the_middle_like_the_reader(collected, tmp_path):
    lines = _lines(collected)
    torn = tmp_path / "t.jsonl"
    torn.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2] + b"\n" + b"".join(lines[2:]))
    with pytest.warns(UserWarning, match=r"t\.jsonl:2: skipping a broken trajectory line"):
        stats = harvest(torn, tmp_path / "h")  # before: ValueError "not JSON" on every rerun
    assert stats["lines_skipped_broken"] == 1 and stats["tasks_seen"] == len(lines) - 1


def test_harvest_cli_after_a_sigkill_reads_past_the_torn_tail(collected, tmp_path):
    lines = _lines(collected)
    torn = tmp_path / "t.jsonl"
    torn.write_bytes(b"".join(lines[:-1]) + lines[-1][:40])  # a write cut by SIGKILL: no newline
    r = subprocess.run(
        [sys.executable, "-m", "collect.harvest", str(torn), "--out", str(tmp_path / "h")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["lines_skipped_broken"] == 1


def test_harvest_cli_names_a_missing_file_and_exits_2(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "collect.harvest", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "h")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "nope.jsonl" in r.stderr and "Traceback" not in r.stderr


def test_a_second_writer_on_the_same_out_exits_2(collected, capsys):
    before = _lines(collected)
    fd = lock_out(collected)  # another collect process holds OUT (flock is per open file: this conflicts too)
    try:
        rc = collect_main(
            ["--out", str(collected), "--split", "train", "--limit", "6", "--no-harvest", "--no-progress"]
        )
    finally:
        unlock_out(fd)
    assert rc == 2 and "being written by another collect process" in capsys.readouterr().err
    assert _lines(collected) == before  # nothing written, nothing doubled


def test_lock_is_released_so_a_later_run_resumes(collected):
    rc = collect_main(["--out", str(collected), "--split", "train", "--limit", "4", "--no-harvest", "--no-progress"])
    assert rc == 0
    ids = [json.loads(x)["task_id"] for x in _lines(collected)]
    assert len(ids) == len(set(ids)) == 4


@pytest.mark.parametrize("meta", [None, "", "[1, 2]", "{not json"])
def test_trajectories_without_a_readable_run_config_are_refused(collected, tmp_path, capsys, meta):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trajectories.jsonl").write_bytes((collected / "trajectories.jsonl").read_bytes())
    if meta is not None:
        (out / "run_config.json").write_text(meta)
    rc = collect_main(["--out", str(out), "--split", "train", "--limit", "4", "--no-harvest", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "run_config.json" in err and "Traceback" not in err  # before: mixed in, or a traceback
    assert _lines(out) == _lines(collected)
