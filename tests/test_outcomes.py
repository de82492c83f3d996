"""Outcome labels that follow from the ledger (issue 15 item 5): a planner that tried every useful tool, all of which
failed, and then declares "insufficient" ends `insufficient` (failed attempts count in the advance check); one that
declares it before trying is still blocked by the gate."""

from __future__ import annotations

import json

import pytest

from collect.ledger import Asset, TaskContext
from tests.fakes import FakeChatServer, text, tool_call
from tests.helpers.loop_script import run

R0 = TaskContext(task_id="o-1", question="When was the bridge opened?", assets=(Asset("v1", "video", 60.0),))
NEEDS = {"needs": [{"need": "opening year", "preferred_source": "web", "query_focus": "bridge opened"}]}
NOTHING = text(json.dumps({"verdict": "INSUFFICIENT", "gap_diagnosis": {"gap_type": "insufficient"}}))


def _run(srv, **kw):
    return run(srv, r0=R0, **kw)  # the shared scripted-run helper (real client, roles, run_task)


@pytest.fixture
def srv():
    with FakeChatServer() as s:
        s.script("need_parser", text(json.dumps(NEEDS)))
        s.default("finalizer", text("insufficient"))
        yield s


def test_insufficient_after_every_useful_tool_failed_ends_insufficient(srv):
    srv.script(
        "planner",
        tool_call("web_search", {"query": "bridge opened", "need_index": 0}),
        tool_call("finish", {"answer": "insufficient"}),
    )
    srv.script("critic", NOTHING)
    rec = _run(srv)
    # before: blocked twice (the gate ignored the failed attempt), then forced with the finalizer's answer
    assert rec["outcome"] == "insufficient"
    assert [s["action"]["name"] for s in rec["steps"]] == ["web_search", "finish"]
    assert not any(e["kind"] == "finish_blocked" for s in rec["steps"] for e in s["events"])


def test_insufficient_before_trying_the_useful_tool_is_still_blocked(srv):
    srv.script(
        "planner",
        tool_call("finish", {"answer": "insufficient"}),
        tool_call("finish", {"answer": "insufficient"}),
        tool_call("finish", {"answer": "insufficient"}),
    )
    rec = _run(srv, max_revisions=2)
    kinds = [e["kind"] for s in rec["steps"] for e in s["events"]]
    assert kinds.count("finish_blocked") == 2 and rec["outcome"] == "forced"


def test_a_prompt_over_the_models_context_ends_the_run_as_budget_exhausted_not_an_error(srv):
    from tests.fakes import Reply

    over = {
        "error": {"message": "This model's maximum context length is 4096 tokens", "code": "context_length_exceeded"}
    }
    srv.script("planner", Reply(status=400, raw_body=json.dumps(over)))
    rec = _run(srv)  # before: ChatError("status") escaped run_task and the task was retried forever
    assert rec["outcome"] == "budget_exhausted" and rec["steps"] == []
    assert rec["final_events"][-1]["reason"] == "the planner prompt exceeds the model's context"
