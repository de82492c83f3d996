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


OVER = {"error": {"message": "This model's maximum context length is 4096 tokens", "code": "context_length_exceeded"}}
FOUND = text(
    json.dumps(
        {
            "verdict": "SUFFICIENT",
            "gap_diagnosis": {"gap_type": "sufficient", "description": "found it"},
            "updated_need_statuses": [{"need_index": 0, "status": "filled", "value": "1931", "source": "web"}],
        }
    )
)


@pytest.mark.parametrize("role", ["finalizer", "answer_critic"])
def test_a_finalizer_or_answer_critic_prompt_over_the_context_ends_the_run_like_the_planners(srv, role):
    """Issue 52 class 6. Before: the finalizer's 400 context_length_exceeded escaped run_task, so the task errored on
    every rerun (the planner's was handled)."""
    from tests.fakes import Reply

    srv.script("planner", tool_call("web_search", {"query": "bridge opened", "need_index": 0}))
    srv.script("planner", tool_call("finish", {"answer": "1931"}))
    srv.script("critic", FOUND)
    srv._queues["finalizer"].clear()
    if role == "finalizer":
        srv.script("finalizer", Reply(status=400, raw_body=json.dumps(OVER)))
    else:
        srv.script("finalizer", text("1931"))
        srv.script("answer_critic", Reply(status=400, raw_body=json.dumps(OVER)))
    rec = _run(srv)
    assert rec["outcome"] == "budget_exhausted" and rec["answer"] is None
    stop = [e for e in rec["steps"][-1]["events"] if e["kind"] == "stop"]
    assert [e["reason"] for e in stop] == [f"the {role} prompt exceeds the model's context"]
    assert role in rec["usage"]  # the failed call is accounted


def test_the_finalizer_prompt_is_bounded_however_many_atoms_the_critic_added():
    """Before: the finalizer prompt listed every evidence atom (174 KB after 14 full critic verdicts)."""
    from collect.ledger import Atom, Ledger, Need
    from collect.roles.render import MAX_ATOMS_PER_NEED, MAX_EVIDENCE_CHARS, render_finalizer_messages

    def need(i: int) -> Need:
        return Need(i, f"fact {i}", "web", "blocking", "external_fact", (), f"fact {i}", "filled", value=f"v{i}-1")

    needs = tuple(need(i) for i in range(14))
    atoms = tuple(
        Atom(id=f"a{k}-{i}", need_index=i, value=f"v{i}-{k}", content="x" * 3000, source="web_search")
        for k in range(1, 15)
        for i in range(14)
    )
    led = Ledger(needs=needs, atoms=atoms)
    user = render_finalizer_messages(R0, led)[1]["content"]
    assert len(user) <= MAX_EVIDENCE_CHARS + 400  # was 14 * 14 atoms, ~50 KB of atom lines alone
    assert "v3-1" in user  # the atom that gave need 3 its value is kept
    assert f"Evidence atoms ({14 * 14 - 14 * MAX_ATOMS_PER_NEED} earlier atoms not shown):" in user
