"""Reliability of a collect run: crash-safe resume, fault injection, fail-fast bad input, secrets never written.

Every run here talks to a scripted fake OpenAI-compatible server on loopback (tests/fakes.py) with the real openai
client; the planner is the endpoint, the other roles are the offline teacher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from collect.config import load_config
from collect.run import run_collection
from tests.fakes import (
    FakeChatServer,
    Reply,
    empty,
    fault_429,
    fault_500,
    hang,
    malformed,
    tool_call,
    truncated_tool_call,
)

ROOT = Path(__file__).resolve().parents[1]
FINISH = tool_call("finish", {"answer": "unknown"})


def write_config(path: Path, base_url: str, **over) -> Path:
    endpoint = {"base_url": base_url, "model": "fake-planner", "timeout_s": 2.0, "max_retries": 4}
    endpoint.update(over.pop("endpoint", {}))
    cfg = {
        "name": "reliability",
        "tasks": {"kind": "embedded", "seed": 0},
        "split": "test",
        "runtime": {"arm": "ledger", "max_steps": 15, "max_revisions": 2, "concurrency": over.pop("concurrency", 1)},
        "roles": {"planner": "fake"},
        "endpoints": {"fake": endpoint},
        "harvest": {"enabled": False},
        "progress": False,
    }
    cfg.update(over)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _wait_lines(traj: Path, k: int, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and (not traj.exists() or len(traj.read_text().splitlines()) < k):
        time.sleep(0.05)


def lines(path: Path) -> list[dict]:
    """Every complete line must be valid JSON. A SIGKILL can cut the last write short (Linux stops a multi-page
    write to a regular file at a fatal signal), leaving a last line without its newline: the documented torn tail
    that the next writer repairs and every reader skips. Anything else torn is a failure."""
    text = path.read_text()
    raw = text.splitlines()
    if raw and not text.endswith("\n"):
        raw = raw[:-1]
    return [json.loads(x) for x in raw]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


# --------------------------------------------------------------------------------------------------------------------
# 1. crash-safe, resumable runs
# --------------------------------------------------------------------------------------------------------------------


def test_sigkill_mid_run_then_rerun_finds_every_task_exactly_once(tmp_path):
    n = 16
    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}, delay_s=0.15))
        cfg = write_config(tmp_path / "c.yaml", srv.base_url, concurrency=2)
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "collect", "--config", str(cfg), "--out", str(out), "--limit", str(n)]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        traj = out / "trajectories.jsonl"
        _wait_lines(traj, 3, timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        partial = lines(traj)
        assert 3 <= len(partial) < n, f"kill should land mid-run, got {len(partial)} finished"
        rerun = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
    ids = [r["task_id"] for r in lines(traj)]
    assert len(ids) == n and len(set(ids)) == n, "every task exactly once"
    assert ids[: len(partial)] == [r["task_id"] for r in partial], "finished tasks were kept, not redone"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_tasks"] == n


def test_changed_config_refuses_to_mix_into_an_old_out(tmp_path, finish_planner_server):
    srv = finish_planner_server
    out = tmp_path / "out"
    run_collection(load_config(write_config(tmp_path / "a.yaml", srv.base_url, limit=2)), out)
    other = load_config(write_config(tmp_path / "b.yaml", srv.base_url, limit=2, endpoint={"temperature": 0.7}))
    with pytest.raises(RuntimeError, match="another configuration"):
        run_collection(other, out)
    run_collection(other, out, allow_mixed_config=True)  # told to: allowed
    assert len(lines(out / "trajectories.jsonl")) == 2  # same task ids: already finished, skipped


# --------------------------------------------------------------------------------------------------------------------
# 2. fault injection
# --------------------------------------------------------------------------------------------------------------------


def test_injected_faults_are_survived_counted_by_kind_and_lose_no_trajectory(tmp_path, monkeypatch):
    from collect.tools import ToolBox

    real_execute = ToolBox.execute

    async def flaky_execute(self, name, arguments):
        if name == "web_search" and arguments.get("query") == "boom":
            raise RuntimeError("search backend crashed")  # a tool that raises (not even a ToolFailure)
        return await real_execute(self, name, arguments)

    monkeypatch.setattr(ToolBox, "execute", flaky_execute)
    n = 3
    with FakeChatServer() as srv:
        srv.script(
            "planner",
            fault_500(),
            fault_429(retry_after=0.2),
            hang(4.0),  # past the 1 s timeout
            malformed(),
            truncated_tool_call("web_search", {"query": "x"}),  # model error: unparseable arguments
            empty(),  # model error: no action
            tool_call("web_search", {"query": "boom"}),  # the tool raises
        )
        srv.default("planner", FINISH)
        cfg = load_config(write_config(tmp_path / "c.yaml", srv.base_url, limit=n, endpoint={"timeout_s": 1.0}))
        summary = run_collection(cfg, tmp_path / "out")
        planner_requests = len(srv.role_requests("planner"))
    recs = lines(tmp_path / "out" / "trajectories.jsonl")
    assert sorted(r["task_id"] for r in recs) == sorted({r["task_id"] for r in recs}) and len(recs) == n
    assert summary["faults"] == {"malformed": 1, "rate_limit": 1, "server_error": 1, "timeout": 1}
    assert summary["model_errors"] == {"planner:no_action": 1, "planner:unparseable": 1}
    assert summary["tool_errors"] == 1
    assert summary["errored_tasks"] == {}
    planner_steps = sum(len(r["steps"]) for r in recs)
    # every retry is accounted for: requests = planner decisions + one retry per transport fault
    assert planner_requests == planner_steps + 4


def test_retry_budget_is_respected_and_an_exhausted_task_is_retried_on_resume(tmp_path):
    with FakeChatServer() as srv:
        srv.script("planner", *[fault_500() for _ in range(3)])  # max_retries=2 -> 3 attempts, all fail
        srv.default("planner", FINISH)
        cfg = load_config(write_config(tmp_path / "c.yaml", srv.base_url, limit=2, endpoint={"max_retries": 2}))
        first = run_collection(cfg, tmp_path / "out")
        assert len(srv.role_requests("planner")) >= 3
        failed = list(first["errored_tasks"])
        assert len(failed) == 1 and first["n_tasks"] == 1
        second = run_collection(cfg, tmp_path / "out")
    ids = [r["task_id"] for r in lines(tmp_path / "out" / "trajectories.jsonl")]
    assert second["errored_tasks"] == {} and sorted(ids) == sorted(set(ids)) and len(ids) == 2
    assert failed[0] in ids


# --------------------------------------------------------------------------------------------------------------------
# 4. bad input fails fast, names the culprit, writes nothing
# --------------------------------------------------------------------------------------------------------------------


def _collect(args, tmp_path):
    return subprocess.run(
        [sys.executable, "-m", "collect", *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )


def test_malformed_task_file_fails_fast_naming_file_task_and_field(tmp_path):
    bad = tmp_path / "tasks.json"
    bad.write_text(
        json.dumps([{"id": "t-1", "question": "q?", "answer": "a", "assets": [{"id": "v", "type": "hologram"}]}])
    )
    out = tmp_path / "out"
    r = _collect(["--tasks", str(bad), "--out", str(out)], tmp_path)
    assert r.returncode == 2
    assert str(bad) in r.stderr and "t-1" in r.stderr and "type" in r.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    "patch,needle",
    [
        ({"roles": {"planner": "fake", "judge_of_everything": "offline"}}, "judge_of_everything"),
        ({"roles": {"planner": "nonexistent-endpoint"}}, "nonexistent-endpoint"),
        ({"tools": {"perception_backend": "telepathy"}}, "telepathy"),
        ({"tools": {"no_such_tool_option": 1}}, "no_such_tool_option"),
        ({"runtime": {"arm": "chain-of-vibes"}}, "chain-of-vibes"),
    ],
)
def test_unknown_names_in_config_fail_fast_and_write_nothing(tmp_path, patch, needle):
    cfg = write_config(tmp_path / "c.yaml", "http://127.0.0.1:9/v1", **patch)
    out = tmp_path / "out"
    r = _collect(["--config", str(cfg), "--out", str(out)], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert needle in r.stderr
    assert not out.exists()


def test_unreachable_endpoint_at_start_up_fails_fast_naming_the_url(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    cfg = write_config(tmp_path / "c.yaml", url, limit=2)
    out = tmp_path / "out"
    t0 = time.time()
    r = _collect(["--config", str(cfg), "--out", str(out)], tmp_path)
    assert r.returncode == 2 and url in r.stderr
    assert time.time() - t0 < 60
    assert not out.exists()


def test_missing_media_is_reported_per_task(tmp_path):
    from collect.loaders import load_omnigaia

    tasks = load_omnigaia(ROOT / "data/omnigaia/test_metadata.json", media_root=tmp_path)
    missing = [t for t in tasks if t.meta.get("missing_media")]
    assert len(missing) == len(tasks)  # empty media root: every task names what it lacks
    assert all(isinstance(m, str) for m in missing[0].meta["missing_media"])


# --------------------------------------------------------------------------------------------------------------------
# 5. secrets
# --------------------------------------------------------------------------------------------------------------------


def _collect_cli(cfg: Path, out: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m collect --config CFG --out OUT` with extra environment variables (a key), output captured."""
    cmd = [sys.executable, "-m", "collect", "--config", str(cfg), "--out", str(out)]
    return subprocess.run(cmd, cwd=ROOT, env={**_env(), **env}, capture_output=True, text=True, timeout=timeout)


def test_api_key_is_used_but_appears_in_no_trajectory_summary_report_or_log(tmp_path, finish_planner_server):
    secret = "sk-od-test-" + "9f3a7c1e5b2d4a6f8e0c"
    srv = finish_planner_server
    seen_before = len(srv.auth_headers)  # the server is shared: look only at this run's requests
    cfg = write_config(tmp_path / "c.yaml", srv.base_url, limit=3, endpoint={"api_key_env": "OD_TEST_KEY"})
    out = tmp_path / "out"
    r = _collect_cli(cfg, out, {"OD_TEST_KEY": secret})
    assert r.returncode == 0, r.stderr[-2000:]
    auth = [h for h in srv.auth_headers[seen_before:] if h]
    assert auth and all(secret in h for h in auth), "the key must reach the endpoint"
    from pipeline.report import write_report

    recs = lines(out / "trajectories.jsonl")
    write_report(out / "report.html", "t", {"c": json.loads((out / "summary.json").read_text())}, {"c": recs})
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"trajectories.jsonl", "summary.json", "run_config.json", "report.html"}
    for p in files:
        assert secret not in p.read_text(errors="ignore"), p
    assert secret not in r.stdout and secret not in r.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_a_model_reply_holding_the_key_is_redacted_from_every_file_and_the_console(tmp_path, workers):
    """Issue 52, class 7: the planner (an endpoint that saw the key, or a model that was told it) writes the key into
    its reply text, a tool query and its answer. Nothing OUT holds, nor stdout/stderr, may contain it. The key is not
    key-shaped, so only the redaction of known values (every api_key_env the config names) can catch it."""
    secret = "velvet-otter-4242-lantern-0917"
    with FakeChatServer() as srv:
        srv.script(
            "planner",
            Reply(content=f"Thinking. My key is {secret}."),  # no tool call: a model error holding the key
            tool_call("web_search", {"query": f"who owns {secret}", "need_index": 0}),
        )
        srv.default("planner", tool_call("finish", {"answer": f"the answer is {secret}"}))
        cfg = write_config(
            tmp_path / "c.yaml", srv.base_url, limit=2, workers=workers, endpoint={"api_key_env": "OD_ECHO_KEY"}
        )
        out = tmp_path / "out"
        r = _collect_cli(cfg, out, {"OD_ECHO_KEY": secret}, timeout=180)
        assert r.returncode == 0, r.stderr[-2000:]
        assert any(secret in h for h in srv.auth_headers), "the key must reach the endpoint"
    recs = lines(out / "trajectories.jsonl")
    assert len(recs) == 2 and "[REDACTED]" in json.dumps(recs)  # before: the key verbatim in every record
    outputs = [s["planner_output"] for rec in recs for s in rec["steps"]]
    assert any("My key is [REDACTED]." in (o["text"] or "") for o in outputs)
    for p in out.rglob("*"):
        if p.is_file():
            assert secret not in p.read_text(errors="ignore"), p
    assert secret not in r.stdout and secret not in r.stderr


def test_logs_written_through_setup_logging_are_redacted(tmp_path):
    secret = "velvet-otter-4242-lantern-0917"
    code = (
        "import logging, os\n"
        "from collect.run import setup_logging\n"
        "from collect.llm import register_key_env\n"
        "setup_logging()\n"
        "register_key_env('OD_LOG_KEY')\n"
        "logging.getLogger('collect.loop').warning('model said %s', os.environ['OD_LOG_KEY'])\n"
        "try:\n"
        "    raise ValueError('reply ' + os.environ['OD_LOG_KEY'])\n"
        "except ValueError:\n"
        "    logging.getLogger('collect').exception('task crashed')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**_env(), "OD_LOG_KEY": secret}, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "model said [REDACTED]" in r.stderr and "ValueError: reply [REDACTED]" in r.stderr, r.stderr
    assert secret not in r.stderr and secret not in r.stdout


# --------------------------------------------------------------------------------------------------------------------
# 6. worker processes (workers > 1): SIGKILL of one worker or of the parent
# --------------------------------------------------------------------------------------------------------------------


def _worker_pids(parent: int, want: int, timeout: float = 90.0) -> list[int]:
    """Pids of the parent's multiprocessing workers (spawned children; not its resource tracker)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            kids = []
        pids = []
        for k in kids:
            try:
                cmd = Path(f"/proc/{k}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
                pids.append(int(k))
        if len(pids) >= want:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"{want} worker processes of {parent} did not start")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigkill_of_one_worker_loses_only_its_unfinished_tasks_and_a_rerun_finishes_them_once(tmp_path):
    n = 16
    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}, delay_s=0.3))
        cfg = write_config(tmp_path / "c.yaml", srv.base_url, concurrency=2)
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "collect", "--config", str(cfg), "--out", str(out), "--limit", str(n)]
        proc = subprocess.Popen([*cmd, "--workers", "2"], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL)
        workers = _worker_pids(proc.pid, 2)
        traj = out / "trajectories.jsonl"
        _wait_lines(traj, 3)
        os.kill(workers[0], signal.SIGKILL)
        rc = proc.wait(timeout=120)
        assert rc == 3, "unfinished tasks make the run exit 3"
        first = lines(traj)
        summary = json.loads((out / "summary.json").read_text())
        errored = summary["errored_tasks"]
        assert 3 <= len(first) < n and errored, "the kill landed mid-run"
        assert all("exited" in why for why in errored.values())
        ids = [r["task_id"] for r in first]
        assert len(ids) == len(set(ids)) and len(ids) + len(errored) == n, "the other worker's results were all kept"
        assert not set(ids) & set(errored)
        rerun = subprocess.run([*cmd, "--workers", "2"], cwd=ROOT, env=_env(), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
    ids2 = [r["task_id"] for r in lines(traj)]
    assert len(ids2) == n and len(set(ids2)) == n, "every task exactly once"
    assert ids2[: len(ids)] == ids and set(ids2[len(ids) :]) == set(errored), "only the lost tasks were rerun"


def test_sigkill_of_the_parent_stops_its_workers_and_a_rerun_finds_every_task_exactly_once(tmp_path):
    n = 16
    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}, delay_s=0.3))
        cfg = write_config(tmp_path / "c.yaml", srv.base_url, concurrency=2)
        out = tmp_path / "out"
        cmd = [sys.executable, "-m", "collect", "--config", str(cfg), "--out", str(out), "--limit", str(n)]
        cmd += ["--workers", "2"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        workers = _worker_pids(proc.pid, 2)
        traj = out / "trajectories.jsonl"
        _wait_lines(traj, 3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 15
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers), "orphaned workers must stop"
        partial = lines(traj)
        assert 3 <= len(partial) < n, f"kill should land mid-run, got {len(partial)} finished"
        time.sleep(1.0)  # nothing is written after the parent is gone
        assert lines(traj) == partial
        rerun = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stderr[-2000:]
    ids = [r["task_id"] for r in lines(traj)]
    assert len(ids) == n and len(set(ids)) == n, "every task exactly once"
    assert ids[: len(partial)] == [r["task_id"] for r in partial]
    assert json.loads((out / "summary.json").read_text())["n_tasks"] == n
