"""Hostile model output (issue 16, classes 1-4): replies built to break the runtime, sent through the real client from
a scripted loopback server. A reply may fail its step or its task; it never aborts the run, never writes invalid
UTF-8, never overflows the stack, never makes the reducer quadratic, and never grows later prompts without bound."""

from __future__ import annotations

import json

import pytest

import collect.ledger as ledger_mod
from collect.bounds import Limits, clean_json, json_depth
from collect.ledger import (
    Asset,
    NeedsDeclared,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    ObservationCommitted,
    TaskContext,
    Verdict,
    initial_ledger,
    reduce,
    state_hash,
)
from collect.roles.openai_roles import parse_verdict
from collect.trajectory import TrajectoryWriter, read_trajectories
from tests.fakes import FakeChatServer, text, tool_call
from tests.helpers.loop_script import all_events, run

R0 = TaskContext(task_id="h-1", question="Which year?", assets=(Asset("v1", "video", 60.0),))
NEEDS = {"needs": [{"need": "the year", "preferred_source": "web", "query_focus": "year"}]}
DEEP = 100_000
DEEP_REPLY = 3_000  # deeper than the interpreter's recursion limit, short enough to pass the reply-size bound


def _critic(updates, verdict="INSUFFICIENT"):
    return text(json.dumps({"verdict": verdict, "gap_diagnosis": {"gap_type": "x"}, "updated_need_statuses": updates}))


def _run(srv, **kw):
    return run(srv, r0=R0, **kw)  # the shared scripted-run helper (real client, roles, run_task)


def _events(rec):
    return all_events(rec)


@pytest.fixture
def srv():
    with FakeChatServer() as s:
        s.script("need_parser", text(json.dumps(NEEDS)))
        s.default("finalizer", text("1999"))
        s.default("answer_critic", text(json.dumps({"verdict": "PASS"})))
        yield s


# ---- class 1: lone surrogates -----------------------------------------------------------------------------------
def test_lone_surrogates_in_reply_arguments_and_critic_value_are_written_as_valid_utf8(srv, tmp_path):
    srv.script(
        "planner",
        text(
            "\udc80 thinking <tool_call>"
            + json.dumps({"name": "web_search", "arguments": {"query": "q\udc80"}})
            + "</tool_call>"
        ),
        tool_call("web_search", {"query": "year \ud800", "need_index": 0}),
        tool_call("finish", {"answer": "19\udc8099"}),
    )
    srv.script(
        "critic", _critic([]), _critic([{"need_index": 0, "status": "filled", "value": "1999\udfff"}], "SUFFICIENT")
    )
    rec = _run(srv)  # before: UnicodeEncodeError in call_signature / state_hash / the trajectory append
    assert rec["outcome"] == "accepted"
    state_hash(ledger_mod.ledger_from_dict(rec["final_ledger"]))
    writer = TrajectoryWriter(tmp_path / "t.jsonl")
    writer.append(rec)
    raw = (tmp_path / "t.jsonl").read_bytes()
    raw.decode("utf-8")  # strict: valid UTF-8
    assert "\ufffd" in raw.decode("utf-8")
    assert read_trajectories(tmp_path / "t.jsonl")[0]["task_id"] == "h-1"


def test_writer_scrubs_a_record_that_still_holds_a_surrogate(tmp_path):
    TrajectoryWriter(tmp_path / "t.jsonl").append({"task_id": "x", "text": "bad \udc80", "nested": [{"k\ud800": 1}]})
    rec = json.loads((tmp_path / "t.jsonl").read_bytes().decode("utf-8"))
    assert rec["text"] == "bad \ufffd" and rec["nested"] == [{"k\ufffd": 1}]


# ---- class 2: deep nesting ----------------------------------------------------------------------------------------
def test_deeply_nested_tool_arguments_are_a_model_error_not_a_crash(srv):
    deep_args = '{"query": "x", "extra": ' + "[" * DEEP_REPLY + "]" * DEEP_REPLY + "}"
    srv.script(
        "planner",
        tool_call("web_search", {"query": "x"}),  # replaced below by a raw deep arguments string
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv._queues["planner"][0].tool_calls[0]["function"]["arguments"] = deep_args
    srv.script("critic", _critic([{"need_index": 0, "status": "filled", "value": "1999"}], "SUFFICIENT"))
    rec = _run(srv)  # before: RecursionError escaped parse_action and errored the task
    errs = [e["error"] for e in _events(rec) if e["kind"] == "model_error"]
    assert errs == ["too_deep"] and rec["outcome"] == "accepted"


def test_deeply_nested_text_tool_call_and_critic_reply_are_unreadable_not_a_crash(srv):
    srv.script(
        "planner",
        text(
            '<tool_call>{"name": "web_search", "arguments": '
            + '{"a": ' * DEEP_REPLY
            + "1"
            + "}" * DEEP_REPLY
            + "}</tool_call>"
        ),
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", text('{"verdict": "SUFFICIENT", "x": ' + "[" * DEEP_REPLY + "]" * DEEP_REPLY + "}"))
    rec = _run(srv, max_revisions=0)
    model_errors = [(e["role"], e["error"]) for e in _events(rec) if e["kind"] == "model_error"]
    assert model_errors[0] == ("planner", "too_deep") and model_errors[1][0] == "critic"


def test_bounds_helpers_never_recurse():
    assert json_depth("[" * DEEP + "]" * DEEP) == DEEP
    assert json_depth('"[[[[" [1]') == 1  # brackets inside strings do not count
    nested: list = []
    cur = nested
    for _ in range(50):
        cur.append([])
        cur = cur[0]
    with pytest.raises(ValueError):
        clean_json(nested, max_depth=10)
    assert clean_json({"a\udc80": ["b\ud800", 1, None]}, max_depth=5) == {"a\ufffd": ["b\ufffd", 1, None]}


# ---- class 3: the reducer stays linear in the size of a verdict --------------------------------------------------
@pytest.mark.parametrize("k", [400, 1600])
def test_conflicting_updates_in_one_verdict_cost_linear_work(monkeypatch, k):
    calls = {"n": 0}
    real = ledger_mod.normalize_value

    def counting(v):
        calls["n"] += 1
        return real(v)

    monkeypatch.setattr(ledger_mod, "normalize_value", counting)
    s = reduce(initial_ledger(), NeedsDeclared((NeedSpec("x"),)))
    obs = NormalizedObservation(tool="web_search", ok=True, summary="s")
    v = Verdict("INSUFFICIENT", updates=tuple(NeedUpdate(0, "filled", value=f"v{i}") for i in range(k)))
    s2 = reduce(s, ObservationCommitted("web_search", "{}", obs, v))
    # every value disagrees: one conflict holding every atom, nothing overwritten
    assert len(s2.conflicts) == 1 and len(s2.conflicts[0].atom_ids) == k and s2.needs[0].value == "v0"
    # before: the sides of the conflict were recomputed for every update (k^2 / 2 normalizations: 80,000 at k=400)
    assert calls["n"] <= 4 * k


# ---- class 4: unbounded text --------------------------------------------------------------------------------------
def test_a_200kb_critic_value_and_focus_do_not_grow_later_prompts(srv):
    big = "y" * 200_000
    srv.script(
        "planner",
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("web_search", {"query": "year again", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script(
        "critic",
        _critic([{"need_index": 0, "status": "partial", "revised_query_focus": big}]),
        _critic([{"need_index": 0, "status": "filled", "value": big}], "SUFFICIENT"),
    )
    rec = _run(srv, max_revisions=0)
    sizes = [len(json.dumps(s["planner_input"]["messages"])) for s in rec["steps"]]
    lim = Limits()
    assert max(sizes) < sizes[0] + 4 * lim.max_value_chars, sizes  # before: ~200 KB more per prompt
    assert len(json.dumps(rec)) < 200_000


def test_a_5mb_critic_reply_is_unreadable_without_parsing_it():
    reply = '{"verdict": "SUFFICIENT", "x": "' + "z" * 5_000_000 + '"}'
    assert parse_verdict(reply) is None  # over Limits.max_reply_chars: never scanned (before: ~40 s)


def test_an_oversized_planner_reply_and_tool_echo_stay_bounded(srv):
    huge_query = "q" * 2_000_000
    srv.script(
        "planner",
        tool_call("web_search", {"query": huge_query, "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    rec = _run(srv, max_revisions=0)
    errs = [e["error"] for e in _events(rec) if e["kind"] == "model_error"]
    assert errs[0] == "oversized"
    assert len(json.dumps(rec)) < 300_000  # before: the 2 MB query echoed into the observation and every record
