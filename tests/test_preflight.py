"""Pre-flight (issue 52, class 2): what would make every task of a run a silent failure is refused before any task
runs and before OUT is touched, with one message that names the cause: offline teacher roles on tasks without a gold
chain, a key variable that is not set, an endpoint that refuses the key."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
import yaml

from collect.__main__ import main as collect_main

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, cfg: dict, capsys) -> tuple[int, str]:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    rc = collect_main(["--config", str(p), "--out", str(tmp_path / "out"), "--no-progress", "--no-harvest"])
    return rc, capsys.readouterr().err


def test_the_offline_teacher_on_tasks_without_a_gold_chain_is_refused(tmp_path, capsys):
    """Before: OmniGAIA with every role offline took 0 steps on each task, answered "insufficient", reported 0.0 and
    exited 0."""
    cfg = {
        "tasks": {"kind": "omnigaia", "path": str(ROOT / "data/omnigaia/test_metadata.json")},
        "split": "train",
        "limit": 3,
        "allow_missing_media": True,
    }
    rc, err = _run(tmp_path, cfg, capsys)
    assert rc == 2 and "['need_parser', 'critic'] are 'offline'" in err and "3 of 3 selected task(s)" in err
    assert "omnigaia-" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["endpoint", "search"])
def test_a_key_variable_that_is_not_set_is_refused_naming_it(tmp_path, capsys, monkeypatch, where):
    """Before: an unset api_key_env went ahead (every call a 401, the message 'rerun to retry'); without a search key
    every web search was a recorded error and the run exited 0."""
    monkeypatch.delenv("OD_NO_SUCH_KEY", raising=False)
    cfg: dict = {"split": "train", "limit": 2}
    if where == "endpoint":
        cfg |= {
            "endpoints": {"llm": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "OD_NO_SUCH_KEY"}},
            "roles": {"planner": "llm"},
        }
    else:
        cfg["tools"] = {
            "web_backend": "http",
            "web_provider_url": "http://127.0.0.1:9/search",
            "web_api_key_env": "OD_NO_SUCH_KEY",
        }
    rc, err = _run(tmp_path, cfg, capsys)
    assert rc == 2 and "key variable(s) not set: OD_NO_SUCH_KEY" in err, err
    assert ("endpoint 'llm'" if where == "endpoint" else "tools.web_provider_url") in err
    assert not (tmp_path / "out").exists()


class _Refuses(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server API
        body = b'{"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_an_endpoint_that_refuses_the_key_is_refused_naming_the_variable(tmp_path, capsys, monkeypatch):
    """Before: a 401 only warned; every task then failed and the message said to rerun the same command."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OD_WRONG_KEY", "sk-not-the-right-one-123456")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    cfg = {
        "split": "train",
        "limit": 2,
        "endpoints": {"llm": {"base_url": url, "model": "m", "api_key_env": "OD_WRONG_KEY"}},
        "roles": {"planner": "llm"},
    }
    try:
        rc, err = _run(tmp_path, cfg, capsys)
    finally:
        server.shutdown()
    assert rc == 2 and "endpoint 'llm'" in err and "refused the key in OD_WRONG_KEY: HTTP 401" in err, err
    assert "Incorrect API key" in err and "sk-not-the-right-one" not in err
    assert not (tmp_path / "out").exists()


def test_a_judge_that_answers_400_leaves_a_count_and_the_servers_message_on_the_console(tmp_path, capsys):
    """Before: accuracy null in summary.json, no count of unjudged tasks and nothing on the console."""
    import json

    from tests.fakes import FakeChatServer, Reply, tool_call

    task = {
        "id": "og-like-1",
        "question": "Which city hosts the Corran festival?",
        "answer": "Tessel",
        "source": "omnigaia",
        "gold_chain": [{"need": "host city", "preferred_source": "web", "query_focus": "Corran festival city"}],
    }
    (tmp_path / "t.jsonl").write_text(json.dumps(task) + "\n")
    (tmp_path / "t.corpus.jsonl").write_text(json.dumps({"url": "u", "title": "t", "text": "nothing here"}) + "\n")
    err400 = json.dumps({"error": {"message": "The model `judge-x` does not exist", "code": "model_not_found"}})
    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "Somewhere"}))
        srv.default("default", Reply(status=400, raw_body=err400))  # every judge call (the judge prompt has no role)
        cfg = {
            "tasks": {"kind": "file", "path": str(tmp_path / "t.jsonl")},
            "split": "all",
            "runtime": {"max_revisions": 0},
            "roles": {"planner": "fake"},
            "endpoints": {
                "fake": {"base_url": srv.base_url, "model": "p"},
                "judge": {"base_url": srv.base_url, "model": "judge-x", "max_retries": 0},
            },
            "judge": {"endpoint": "judge"},
        }
        rc, err = _run(tmp_path, cfg, capsys)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert rc == 0 and summary["accuracy"] is None and summary["n_unjudged"] == 1
    assert "does not exist" in summary["first_unjudged_detail"]
    assert "1 of 1 task(s) are unjudged and not in the accuracy" in err and "does not exist" in err
