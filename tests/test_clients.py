"""One chat client for every OpenAI-compatible call (roles, media perception, reward judge, answer judge), and its
guarantees: classified retries, capped waits, an overall deadline, validated usage, redacted error texts.

Every endpoint here is the scripted loopback server of tests/fakes.py (perception and judge requests carry no role
marker, so they are served from the "default" queue)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from collect.config import EndpointConfig
from collect.llm import ChatClient, ChatError, redact
from tests.fakes import FakeChatServer, Reply, fault_429, fault_500, hang, text, tool_call

ROOT = Path(__file__).resolve().parents[1]
MSG = [{"role": "user", "content": "one two three"}]
SECRET = "sk-proj-Zq8TESTSECRET0123456789abcdef"


def ep(srv, **kw) -> EndpointConfig:
    base = {"base_url": srv.base_url, "model": "m", "max_retries": 3, "timeout_s": 5, "backoff_base_s": 0.01}
    return EndpointConfig(**{**base, **kw})


def chat(cfg: EndpointConfig, limit_s: float = 15.0, **client_kw):
    """One chat() under an outer wall-clock guard, so a client that would hang fails the test instead."""

    async def go():
        c = ChatClient(cfg, **client_kw)
        try:
            return await asyncio.wait_for(c.chat(MSG), limit_s)
        finally:
            await c.close()

    return asyncio.run(go())


@pytest.fixture
def srv():
    with FakeChatServer() as s:
        yield s


def _status(code: int, message: str, headers: dict | None = None) -> Reply:
    return Reply(status=code, raw_body=json.dumps({"error": {"message": message}}), headers=headers or {})


def _completion(usage: dict) -> Reply:
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": usage,
    }
    return Reply(raw_body=json.dumps(body))


# --------------------------------------------------------------------------------------------------------------------
# one client, no import cycle
# --------------------------------------------------------------------------------------------------------------------

_CONSTRUCTION = re.compile(r"\b(?:Async)?OpenAI\(")


def test_the_chat_client_is_the_only_openai_client_built_outside_tests():
    found = []
    for pkg in ("collect", "rewards", "serve", "sft", "rl", "bench"):
        for p in (ROOT / pkg).rglob("*.py"):
            found += [f"{p.relative_to(ROOT)}" for line in p.read_text().splitlines() if _CONSTRUCTION.search(line)]
    assert found == ["collect/llm.py"], found


def test_chat_client_module_is_a_leaf_and_the_old_cycle_members_import_first():
    """collect.llm loads no other collect module but collect.jsonio (strict JSON and redaction, itself a leaf);
    config and roles.base (the old cycle) each import cleanly as the first module of a fresh interpreter."""
    first = ["collect.config", "collect.roles.base"]
    code = (
        "import importlib, subprocess, sys\n"
        "import collect.llm\n"
        "assert sorted(m for m in sys.modules if m.split('.')[0] == 'collect') == "
        "['collect', 'collect.jsonio', 'collect.llm'], "
        "sorted(m for m in sys.modules if m.split('.')[0] == 'collect')\n"
        f"for m in {first!r}:\n"
        "    subprocess.run([sys.executable, '-c', f'import {m}'], check=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


# --------------------------------------------------------------------------------------------------------------------
# capped waits, overall deadline
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{"Retry-After": "inf"}, {"Retry-After": "1e9"}, {"Retry-After": "-5"}, {"Retry-After": "soon"}]
    + [{"Retry-After": "nan"}, {"retry-after-ms": "1e12"}],
)
def test_absurd_retry_after_is_capped_and_the_call_finishes(srv, headers):
    srv.script("default", _status(429, "slow down", headers), text("ok"))
    t0 = time.monotonic()
    r = chat(ep(srv, backoff_max_s=0.3), limit_s=10.0)
    assert r.text == "ok" and r.usage.faults == {"rate_limit": 1} and r.usage.retries == 1
    assert time.monotonic() - t0 < 3.0


def test_a_sane_retry_after_below_the_cap_is_still_honoured(srv):
    srv.script("default", fault_429(retry_after=0.5), text("ok"))
    t0 = time.monotonic()
    assert chat(ep(srv, backoff_max_s=5.0)).text == "ok"
    assert time.monotonic() - t0 >= 0.5


def test_every_call_has_an_overall_deadline_across_retries(srv):
    srv.default("default", hang(3.0))
    t0 = time.monotonic()
    with pytest.raises(ChatError) as e:
        chat(ep(srv, timeout_s=0.5, max_retries=50), deadline_s=1.5)
    took = time.monotonic() - t0
    assert e.value.kind == "deadline" and 1.0 <= took < 2.5, took
    assert e.value.usage.faults["timeout"] >= 2 and e.value.usage.faults["deadline"] == 1


def test_a_wait_that_would_pass_the_deadline_gives_up_at_once(srv):
    srv.script("default", fault_429(retry_after=4.0), text("never reached"))
    t0 = time.monotonic()
    with pytest.raises(ChatError) as e:
        chat(ep(srv, backoff_max_s=10.0), deadline_s=1.0)
    assert e.value.kind == "deadline" and time.monotonic() - t0 < 0.9
    assert len(srv.requests) == 1


def test_default_deadline_never_cuts_the_configured_retries_short(srv):
    srv.script("default", fault_500(), fault_500(), text("ok"))
    c = ep(srv, timeout_s=0.5, max_retries=2, backoff_max_s=0.2)
    r = chat(c)
    assert r.text == "ok" and r.usage.retries == 2


# --------------------------------------------------------------------------------------------------------------------
# usage validation
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-5, 1.5, "12abc", 10**15, True, None])
def test_implausible_token_counts_are_dropped_and_counted_as_a_fault(srv, bad):
    srv.script("default", _completion({"prompt_tokens": bad, "completion_tokens": 3}))
    r = chat(ep(srv))
    assert r.text == "ok"
    if bad is None:  # absent figures are not a fault (many servers omit usage)
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.faults) == (0, 3, {})
    else:
        assert r.usage.prompt_tokens == 0 and r.usage.faults == {"bad_usage": 1}
        assert r.usage.cost_usd >= 0


def test_plausible_token_counts_pass_unchanged(srv):
    srv.script("default", _completion({"prompt_tokens": 40.0, "completion_tokens": 3}))
    r = chat(ep(srv, price_in_per_mtok=1.0))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.faults) == (40, 3, {})


# --------------------------------------------------------------------------------------------------------------------
# redaction
# --------------------------------------------------------------------------------------------------------------------


def test_redact_removes_known_keys_and_key_shaped_strings(monkeypatch):
    monkeypatch.setenv("SOME_ENDPOINT_CRED", "plainvalue-without-shape")
    from collect.llm import register_key_env

    register_key_env("SOME_ENDPOINT_CRED")
    s = redact(
        "Incorrect API key provided: sk-proj-abc123DEF456. header Authorization: Bearer eyJhbGciOi.J9xyz; "
        "api_key=0123456789abcdef0123456789abcdef; token: QmFzZTY0VG9rZW5WYWx1ZTEyMzQ1Ng==; "
        "cred plainvalue-without-shape; model gpt-4o not found"
    )
    for leak in ("sk-proj-abc123DEF456", "eyJhbGciOi", "0123456789abcdef0123", "QmFzZTY0VG9r", "plainvalue-without"):
        assert leak not in s, s
    assert "model gpt-4o not found" in s and "Incorrect API key provided" in s


def test_a_401_that_echoes_the_key_is_redacted_in_the_chat_error(srv, monkeypatch):
    monkeypatch.setenv("CLIENT_TEST_KEY", SECRET)
    srv.script("default", _status(401, f"Incorrect API key provided: {SECRET}. Find your key at ..."))
    with pytest.raises(ChatError) as e:
        chat(ep(srv, api_key_env="CLIENT_TEST_KEY"))
    assert e.value.kind == "status" and "HTTP 401" in str(e.value)
    assert srv.auth_headers[-1] == f"Bearer {SECRET}"  # the key was used...
    assert SECRET not in str(e.value) and SECRET not in e.value.detail and SECRET not in repr(e.value)  # ...not shown
    assert e.value.__cause__ is None and e.value.__suppress_context__


def _write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_a_key_echoed_by_the_endpoint_reaches_no_summary_log_or_stderr(srv, tmp_path, monkeypatch, caplog, capfd):
    from collect.config import load_config
    from collect.run import run_collection

    monkeypatch.setenv("LEAKY_ENDPOINT_KEY", SECRET)
    srv.default("planner", _status(400, f"Incorrect API key provided: {SECRET}"))
    cfg = {
        "tasks": {"kind": "embedded", "seed": 0},
        "split": "test",
        "limit": 2,
        "roles": {"planner": "leaky"},
        "endpoints": {"leaky": {"base_url": srv.base_url, "model": "m", "api_key_env": "LEAKY_ENDPOINT_KEY"}},
        "harvest": {"enabled": False},
        "progress": False,
    }
    out = tmp_path / "out"
    with caplog.at_level("DEBUG"):
        summary = run_collection(load_config(_write(tmp_path / "c.yaml", cfg)), out)
    assert len(summary["errored_tasks"]) == 2 and all("HTTP 400" in m for m in summary["errored_tasks"].values())
    captured = capfd.readouterr()
    texts = [captured.out, captured.err, caplog.text] + [p.read_text() for p in out.iterdir() if p.is_file()]
    assert all(SECRET not in t for t in texts)
    assert any("Incorrect API key provided" in t for t in texts)  # the message itself still gets through


# --------------------------------------------------------------------------------------------------------------------
# perception through the client: retried, accounted, redacted
# --------------------------------------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)  # the fake endpoint never decodes it; only its bytes travel


def _image_task(tmp_path: Path) -> Path:
    (tmp_path / "sign.png").write_bytes(PNG)
    task = {
        "id": "img1",
        "question": "What does the sign say?",
        "answer": "KELMORA",
        "assets": [{"id": "image_1", "type": "image", "path": "sign.png"}],
        "gold_chain": [
            {"need": "the sign text", "preferred_source": "visual", "query_focus": "sign", "gold_value": "KELMORA"}
        ],
    }
    p = tmp_path / "tasks.jsonl"
    p.write_text(json.dumps(task) + "\n")
    return p


def test_perception_429_then_200_is_retried_and_its_tokens_reach_the_summary(srv, tmp_path, monkeypatch):
    from collect.config import load_config
    from collect.run import run_collection

    srv.script("default", fault_429(retry_after=0.05), text("The sign reads KELMORA.", prompt_tokens=321))
    srv.script(
        "planner",
        tool_call("frame_confirm", {"asset_id": "image_1", "query": "sign text", "need_index": 0}),
        tool_call("finish", {"answer": "KELMORA"}),
    )
    srv.default("planner", tool_call("finish", {"answer": "KELMORA"}))
    cfg = {
        "tasks": {"kind": "file", "path": str(_image_task(tmp_path))},
        "split": "all",
        "roles": {"planner": "fake"},
        "endpoints": {"fake": {"base_url": srv.base_url, "model": "planner-m", "timeout_s": 5}},
        "tools": {
            "perception_backend": "media",
            "media_base_url": srv.base_url,
            "media_model": "omni-m",
            "media_root": str(tmp_path),
            "media_api_key_env": "",  # the fake endpoint needs no key
        },
        "harvest": {"enabled": False},
        "progress": False,
    }
    out = tmp_path / "out"
    summary = run_collection(load_config(_write(tmp_path / "c.yaml", cfg)), out)
    assert summary["errored_tasks"] == {} and summary["tool_errors"] == 0
    perception = [b for role, b in srv.requests if role == "default"]
    assert len(perception) == 2 and perception[0]["model"] == "omni-m"  # the 429, then the retry that succeeded
    assert summary["usage_by_role"]["perception"] == {
        "calls": 1,
        "prompt_tokens": 321,
        "completion_tokens": 7,
        "retries": 1,
    }
    planner_tokens = summary["usage_by_role"]["planner"]["prompt_tokens"]
    assert summary["tokens"]["prompt"] == planner_tokens + 321
    assert summary["faults"] == {"rate_limit": 1}
    (rec,) = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert rec["usage"]["perception"]["model"] == "omni-m" and rec["faults"] == {"rate_limit": 1}


def test_perception_that_fails_for_good_is_a_tool_failure_with_its_usage_kept(srv, tmp_path, monkeypatch):
    from collect.tasks import load_tasks
    from collect.tools import ToolBox, ToolFailure, ToolsConfig

    monkeypatch.setenv("MEDIA_TEST_KEY", SECRET)
    srv.script("default", fault_500(), _status(401, f"Incorrect API key provided: {SECRET}"))
    (task,) = load_tasks(_image_task(tmp_path))
    tcfg = ToolsConfig(
        perception_backend="media",
        media_base_url=srv.base_url,
        media_model="omni-m",
        media_api_key_env="MEDIA_TEST_KEY",
        media_root=str(tmp_path),
    )
    box = ToolBox(task, task.to_context(), tcfg)
    box._media.endpoint.backoff_base_s = 0.01  # keep the one retry quick
    with pytest.raises(ToolFailure) as e:
        asyncio.run(box.execute("frame_confirm", {"query": "sign"}))
    assert "HTTP 401" in str(e.value) and SECRET not in str(e.value)
    u = box.take_usage()["perception"]
    assert (u.calls, u.retries, u.faults) == (0, 1, {"server_error": 1})
    assert box.take_usage() == {}  # taken once


# --------------------------------------------------------------------------------------------------------------------
# reward judge through the client: the same classified policy
# --------------------------------------------------------------------------------------------------------------------

JUDGE_OK = text('{"target": 0.7, "align": 0.4}', prompt_tokens=50, completion_tokens=9)


def _judge_score(srv, monkeypatch, **kw):
    from collect import teacher_runs
    from collect.actions import Action
    from rewards.judge import JudgeConfig, JudgeState, OpenAIJudge

    first = teacher_runs.rl_rows(teacher_runs.trajectories(1))[0]  # a recorded first decision: open needs
    row = {k: v for k, v in first.items() if k != "prompt"}
    candidate = Action(**json.loads(row["reference_action"])).to_text()

    monkeypatch.setenv("JUDGE_TEST_KEY", "sk-judge-0123456789")
    judge = OpenAIJudge(
        JudgeConfig(
            kind="openai",
            base_url=srv.base_url,
            model="judge-m",
            api_key_env="JUDGE_TEST_KEY",
            retry_backoff_s=0.01,
            timeout_s=5,
            **kw,
        )
    )
    return judge, asyncio.run(judge.score(JudgeState.from_columns(row), candidate))


def test_reward_judge_retries_a_503(srv, monkeypatch):
    srv.script("default", _status(503, "overloaded"), JUDGE_OK)
    judge, score = _judge_score(srv, monkeypatch, max_retries=2)
    assert (score.target, score.align) == (0.7, 0.4) and len(srv.requests) == 2
    assert judge.usage.faults == {"server_error": 1} and judge.usage.retries == 1
    assert (judge.usage.calls, judge.usage.prompt_tokens, judge.usage.completion_tokens) == (1, 50, 9)


def test_reward_judge_does_not_retry_a_400(srv, monkeypatch):
    srv.script("default", _status(400, "bad request: unknown model"), JUDGE_OK)
    judge, score = _judge_score(srv, monkeypatch, max_retries=2)
    assert score is None and len(srv.requests) == 1 and judge.stats["failures"] == 1


def test_reward_judge_asks_again_after_an_unparseable_reply(srv, monkeypatch):
    srv.script("default", text("no idea, sorry"), JUDGE_OK)
    judge, score = _judge_score(srv, monkeypatch, max_retries=1)
    assert score.target == 0.7 and len(srv.requests) == 2 and judge.usage.faults == {"malformed": 1}


def test_answer_judge_usage_is_recorded_under_role_judge_and_reaches_the_summary(srv, tmp_path):
    """An OmniGAIA-source task whose answer is not an exact match goes to the LLM judge endpoint (a ChatClient from
    the pool): its 500-then-200 is retried, and its tokens, retry and fault are the run's, under role "judge"."""
    from collect.config import load_config
    from collect.run import run_collection

    tasks = _image_task(tmp_path)
    task = json.loads(tasks.read_text())
    tasks.write_text(json.dumps({**task, "source": "omnigaia"}) + "\n")
    srv.default("planner", tool_call("finish", {"answer": "no idea"}))
    srv.script("default", fault_500(), text("Correct", prompt_tokens=77, completion_tokens=2))
    cfg = {
        "tasks": {"kind": "file", "path": str(tasks)},
        "split": "all",
        "runtime": {"max_revisions": 0},
        "roles": {"planner": "fake"},
        "endpoints": {
            "fake": {"base_url": srv.base_url, "model": "planner-m"},
            "judge": {"base_url": srv.base_url, "model": "judge-m", "backoff_base_s": 0.01},
        },
        "judge": {"endpoint": "judge"},
        "harvest": {"enabled": False},
        "progress": False,
        "allow_missing_media": True,  # the planner never looks at the image; only the judge's usage matters here
    }
    out = tmp_path / "out"
    summary = run_collection(load_config(_write(tmp_path / "c.yaml", cfg)), out)
    assert summary["errored_tasks"] == {} and summary["correct"] == 1
    assert summary["usage_by_role"]["judge"] == {"calls": 1, "prompt_tokens": 77, "completion_tokens": 2, "retries": 1}
    assert summary["faults"] == {"server_error": 1}
    assert summary["tokens"]["prompt"] == summary["usage_by_role"]["planner"]["prompt_tokens"] + 77
