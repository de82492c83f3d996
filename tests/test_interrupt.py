"""Ctrl-C (issue 52, class 10): SIGINT to the whole process group of a running collect (the runtime and its sandbox
launcher) ends it with one line and exit 130, never a traceback; what finished is kept and a rerun resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "collect", "--config", "configs/collect/embedded_1800.yaml", "--out", str(out)]
    cmd += ["--split", "train", "--no-harvest", "--no-progress"]
    # SIGINT as a terminal's foreground job has it: a suite started in the background (`cmd &` in a script) inherits
    # SIGINT ignored, and Python then keeps it ignored, so the run would never see the Ctrl-C
    p = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_sigint)
    traj = out / "trajectories.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not traj.exists() or traj.stat().st_size < 200_000):
        time.sleep(0.2)  # some tasks finished, most not: the run is in the middle
    os.killpg(p.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C: every process of the group
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]  # before: 42 lines, 3 tracebacks
    assert "interrupted: what finished is on disk: rerun the same command to resume" in err
    kept = [json.loads(x)["task_id"] for x in traj.read_text().splitlines()]
    assert 0 < len(kept) < 1080
    r = subprocess.run([*cmd, "--limit", str(len(kept) + 5)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    again = [json.loads(x)["task_id"] for x in traj.read_text().splitlines()]
    assert again[: len(kept)] == kept and len(again) == len(set(again)) == len(kept) + 5  # resumed, nothing twice
