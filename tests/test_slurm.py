"""configs/slurm as written, submitted to a real (one-node) Slurm: configs/slurm/local_cluster.sh starts munged,
slurmctld and slurmd from Debian's packages, submit.sh submits the shard array and the dependent merge, and the
merged harvest must be byte for byte one unsharded run's. Skipped (with the reason) where Slurm is not installed or
the test does not run as root; `configs/slurm/local_cluster.sh install` installs it (`make test` does, as root with
CI set)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "configs" / "slurm" / "local_cluster.sh"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")
HARVEST = ("sft.train.jsonl", "sft.eval.jsonl", "rl_states.train.jsonl", "rl_states.eval.jsonl")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _why_not() -> str | None:
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} not found): configs/slurm/local_cluster.sh install"
    if os.geteuid() != 0:
        return "the one-node Slurm runs its daemons as root: run as root"
    return None


@pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))
def test_slurm_runs_the_shard_array_then_the_merge_and_the_harvest_is_one_unsharded_runs(tmp_path):
    state = tmp_path / "slurm"
    r = subprocess.run(["bash", str(SCRIPT), "check", str(state), "2", "20"], capture_output=True, text=True,
                       timeout=1500)  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "Dependency afterok:" in out  # the merge waited for the array (squeue just after submission)
    runs = state / "submit" / "runs"
    # checked here again, not only by the script: 2 shard OUTs that partition the 20 tasks, then the merge
    shard_ids = [
        {json.loads(x)["task_id"] for x in (runs / "shards" / str(k) / "trajectories.jsonl").read_text().splitlines()}
        for k in (0, 1)
    ]
    assert all(shard_ids) and not shard_ids[0] & shard_ids[1] and len(shard_ids[0] | shard_ids[1]) == 20
    logs = sorted(p.name for p in (runs / "shards" / "logs").iterdir())
    assert len([n for n in logs if n.startswith("merge_")]) == 1 and len(logs) == 3, logs  # 2 array tasks + merge
    merged, single = runs / "collect", runs / "unsharded"
    for f in HARVEST:
        assert (merged / f).read_bytes() == (single / f).read_bytes(), f
    assert (merged / "sft.train.jsonl").stat().st_size > 0
    lines = (merged / "trajectories.jsonl").read_text().splitlines()
    assert sorted(lines) == sorted((single / "trajectories.jsonl").read_text().splitlines())
    assert [json.loads(x)["task_id"] for x in lines] == sorted(shard_ids[0] | shard_ids[1])
    assert not list(state.glob("*.pid")) and not (state / "munge" / "munged.pid").exists()  # the daemons stopped
