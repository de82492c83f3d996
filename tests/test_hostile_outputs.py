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
from collect.trajectory import TrajectoryWriter, encode_record, read_trajectories
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


# ---- issue 52, class 4: numbers JSON cannot hold -------------------------------------------------------------------
def _strict(line: bytes):
    """What a strict JSON reader (RFC 8259: no NaN, Infinity or -Infinity) makes of a written line."""

    def refuse(token):
        raise ValueError(f"bare {token} token")

    return json.loads(line, parse_constant=refuse)


def _raw_call(name: str, arguments: str):
    r = tool_call(name, {})
    r.tool_calls[0]["function"]["arguments"] = arguments  # sent verbatim: JSON text the model wrote
    return r


@pytest.mark.parametrize(
    "reply",
    [
        _raw_call("frame_confirm", '{"query": "year", "asset_id": "v1", "time_range": [1e308, Infinity]}'),
        _raw_call("frame_confirm", '{"query": "year", "asset_id": "v1", "time_range": [0, 1e400]}'),  # -> inf
        _raw_call("finish", '{"answer": "1999", "confidence": NaN}'),
        _raw_call("web_search", '{"query": "year", "need_index": 0, "note": -Infinity}'),
        text('<tool_call>{"name": "finish", "arguments": {"answer": "1999", "x": NaN}}</tool_call>'),
    ],
    ids=["time_range_infinity", "time_range_1e400", "finish_extra_nan", "extra_minus_infinity", "text_call_nan"],
)
def test_non_finite_numbers_in_a_planner_reply_are_a_model_error_and_never_written(srv, reply):
    srv.script(
        "planner",
        reply,
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", _critic([{"need_index": 0, "status": "filled", "value": "1999"}], "SUFFICIENT"))
    srv.default("critic", _critic([]))  # the code before the fix ran more tools: it fails on the asserts instead
    rec = _run(srv)  # before: the first reply was an action whose Infinity/NaN the trajectory line held bare
    errs = [(e["role"], e["error"]) for e in _events(rec) if e["kind"] == "model_error"]
    assert errs == [("planner", "unparseable")] and rec["outcome"] == "accepted"
    assert rec["steps"][0]["action"] is None
    detail = next(e["detail"] for e in _events(rec) if e["kind"] == "model_error")
    assert "not JSON" in detail, detail
    _strict(encode_record(rec))


def test_a_window_whose_numbers_overflow_names_no_window(srv):
    """A need parser's focus "between 1e400-ish s and 5 s": the window it names would be [inf, 5.0], which the
    window reference would put into the tool call and the trajectory. Such a focus names no window."""
    huge = "9" * 400  # float() of this is inf
    srv._queues["need_parser"].clear()
    srv.script(
        "need_parser", text(json.dumps({"needs": [{"need": "the year", "query_focus": f"between {huge} s and 5 s"}]}))
    )
    srv.script(
        "planner",
        tool_call("frame_confirm", {"query": "year", "asset_id": "v1", "time_range": "{window:0}", "need_index": 0}),
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", _critic([{"need_index": 0, "status": "filled", "value": "1999"}], "SUFFICIENT"))
    srv.default("critic", _critic([]))  # the code before the fix ran more tools: it fails on the asserts instead
    rec = _run(srv, references=("window",))  # before: frame_confirm ran on [inf, 5.0], a bare Infinity in the line
    errs = [(e["error"], e["detail"]) for e in _events(rec) if e["kind"] == "model_error"]
    assert [k for k, _ in errs] == ["bad_arguments"] and "names no time window" in errs[0][1]
    _strict(encode_record(rec))


# ---- issue 52, class 5: numbers and types the decoder chokes on ---------------------------------------------------
def test_a_5000_digit_integer_in_tool_arguments_is_a_model_error(srv):
    srv.script(
        "planner",
        _raw_call("web_search", '{"query": "year", "need_index": ' + "7" * 5000 + "}"),
        text(
            '<tool_call>{"name": "web_search", "arguments": {"query": "y", "need_index": '
            + "7" * 5000
            + "}}</tool_call>"
        ),
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", _critic([{"need_index": 0, "status": "filled", "value": "1999"}], "SUFFICIENT"))
    srv.default("critic", _critic([]))  # the code before the fix ran more tools: it fails on the asserts instead
    rec = _run(srv)  # before: ValueError (Python's int-string limit) escaped parse_action and errored the task
    errs = [(e["role"], e["error"]) for e in _events(rec) if e["kind"] == "model_error"]
    assert errs == [("planner", "unparseable")] * 2 and rec["outcome"] == "accepted"
    _strict(encode_record(rec))


@pytest.mark.parametrize(
    "reply",
    [
        '{"verdict": "SUFFICIENT", "updated_need_statuses": [{"need_index": Infinity, "status": "filled"}]}',
        "{'verdict': 'SUFFICIENT', 'updated_need_statuses': [{'need_index': 1e999, 'status': 'filled'}]}",
        '{"verdict": "SUFFICIENT", "updated_need_statuses": [{"need_index": ' + "3" * 5000 + ', "status": "filled"}]}',
        "{'verdict': 'SUFFICIENT', 'updated_need_statuses': [{[0]: 1}]}",  # literal_eval: unhashable key
        '{"verdict": "SUFFICIENT", "updated_need_statuses": 5}',
        '{"verdict": "SUFFICIENT", "updated_need_statuses": [{"need_index": 0, "status": "filled", "value": NaN}]}',
    ],
    ids=[
        "need_index_infinity",
        "need_index_1e999_literal",
        "need_index_5000_digits",
        "unhashable",
        "not_a_list",
        "nan",
    ],
)
def test_critic_replies_with_hostile_numbers_and_types_are_unreadable_or_dropped_never_a_crash(srv, reply):
    srv.script(
        "planner",
        tool_call("web_search", {"query": "year", "need_index": 0}),
        tool_call("web_search", {"query": "year again", "need_index": 0}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", text(reply), _critic([{"need_index": 0, "status": "filled", "value": "1999"}], "SUFFICIENT"))
    rec = _run(srv)  # before: OverflowError / ValueError / TypeError out of parse_verdict errored the task
    assert rec["outcome"] == "accepted"
    first = rec["steps"][0]["verdict"]
    assert first["updates"] == [] and rec["final_ledger"]["needs"][0]["value"] == "1999"
    _strict(encode_record(rec))


def test_a_need_parser_reply_with_non_finite_numbers_is_unreadable(srv):
    srv._queues["need_parser"].clear()
    srv.script("need_parser", text('{"needs": [{"need": "the year", "depends_on": [Infinity], "query_focus": NaN}]}'))
    srv.script(
        "planner", tool_call("web_search", {"query": "year", "need_index": 0}), tool_call("finish", {"answer": "1999"})
    )
    srv.script("critic", _critic([{"need_index": 0, "status": "filled", "value": "1999"}], "SUFFICIENT"))
    srv.default("critic", _critic([]))  # the code before the fix ran more tools: it fails on the asserts instead
    rec = _run(srv)
    assert rec["usage"]["need_parser"]["faults"] == {"malformed": 1}  # unreadable: the question becomes the need
    assert rec["need_parse"]["needs"][0]["need"] == R0.question
    _strict(encode_record(rec))
