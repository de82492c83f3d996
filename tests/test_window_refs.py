"""Window references (RuntimeConfig.references "window"): a time_range of "{window:K}" stands for the time window need
K names ("between 35 s and 50 s" -> [35.0, 50.0]), so a planner names the window instead of copying its numbers (the
tuned tiny planners copy a wrong window on 45-61% of such calls: collect.summary.window_stats).

Checked on the real loop (the shipped recipe with value references, window references on and off, the offline
teacher), on harvest, relabelling and the rewards, and on a scripted OpenAI-compatible planner over loopback."""

from __future__ import annotations

import asyncio
import json

import pytest

from collect.actions import (
    REFERENCE_RULES,
    Action,
    ActionError,
    resolve_window_refs,
    validate_action,
    write_window_refs,
)
from collect.loop import ToolFailure
from collect.summary import window_stats
from tests.fakes import FakeChatServer, FakeToolBox, text, tool_call
from tests.helpers.loop_script import NEEDS_WINDOW, R0_WINDOW, answer_critic, critic, fill, needs_reply, run
from tests.helpers.teacher_collect import (
    collect_refs,
    harvested_decisions,
    relabelled_with_and_without,
    same_calls_with_and_without,
)

N_TASKS = 30
WINDOW_REFS_RULE = REFERENCE_RULES["window"]
WINDOWS = {0: (35.0, 50.0), 2: (10.0, 12.5)}


# ---- the resolver --------------------------------------------------------------------------------------------------


def test_a_window_reference_becomes_the_needs_window_and_nothing_else_changes():
    a = Action("frame_confirm", {"asset_id": "v1", "query": "banner", "time_range": "{window:0}", "need_index": 0})
    got = resolve_window_refs(a, WINDOWS)
    assert got.arguments == {**a.arguments, "time_range": [35.0, 50.0]}
    plain = Action("frame_confirm", {"asset_id": "v1", "query": "{window:0}", "time_range": [1.0, 2.0]})
    assert resolve_window_refs(plain, WINDOWS) is plain  # only a whole time_range is a reference


@pytest.mark.parametrize("tr", ["{window:1}", " {window:7} "])
def test_a_reference_to_a_need_without_a_window_is_a_bad_argument_naming_the_ones_with_one(tr):
    a = Action("audio_scout", {"asset_id": "v1", "query": "q", "time_range": tr})
    with pytest.raises(ActionError) as e:
        resolve_window_refs(a, WINDOWS)
    assert e.value.kind == "bad_arguments" and "names no time window (needs with one: 0, 2)" in e.value.detail


def test_any_other_string_is_left_for_the_schema_to_refuse(recorded_states):
    row = next(r for r in recorded_states if json.loads(r["reference_action"])["arguments"].get("time_range"))
    ref = json.loads(row["reference_action"])
    tools = json.loads(row["tools"])
    for bad in ("{window:0} and more", "35-50 s", "{window:x}"):
        a = Action(ref["name"], {**ref["arguments"], "time_range": bad})
        assert resolve_window_refs(a, WINDOWS) is a
        with pytest.raises(ActionError, match="bad_arguments"):
            validate_action(a, tools)


def test_the_teacher_writes_the_reference_of_its_target_need_and_it_resolves_back():
    a = Action("subtitle_grounding", {"asset_id": "v1", "query": "q", "time_range": [10, 12.5], "need_index": 2})
    w = write_window_refs(a, {**WINDOWS, 0: (10.0, 12.5)})  # two needs name this window: the call's own is written
    assert w.arguments["time_range"] == "{window:2}"
    assert resolve_window_refs(w, WINDOWS).arguments["time_range"] == [10.0, 12.5]
    other = Action("subtitle_grounding", {"asset_id": "v1", "query": "q", "time_range": [0.0, 120.0]})
    assert write_window_refs(other, WINDOWS) is other  # a whole-asset scan names no need's window


# ---- the real loop, the offline teacher, harvest, relabelling, rewards ---------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("wrefs")
    return collect_refs(d / "on", N_TASKS, ("need", "window")), collect_refs(d / "off", N_TASKS, ("need",))


def test_the_teacher_names_windows_and_the_tools_get_them(runs):
    (on, on_dir), (off, _) = runs
    written = same_calls_with_and_without(on, off, "window", "{window:")
    assert written >= 5  # the anchor searches of the windowed tasks
    assert window_stats(on) == window_stats(off) and window_stats(on)["window_match_rate"] == 1.0
    decisions = harvested_decisions(on_dir)
    assert sum("{window:" in json.dumps(r["completion"]) for r in decisions) >= 5
    assert all(WINDOW_REFS_RULE in r["prompt"][0]["content"] for r in decisions)


def test_relabelling_writes_window_references_only_where_the_students_prompt_offers_them(runs):
    (on, _), (off, _) = runs
    assert relabelled_with_and_without(on, off, "{window:") >= 5


def test_rewards_resolve_window_references_where_the_prompt_offers_them(runs):
    from rewards import build_judge, use_judge
    from rewards.judge import align
    from rewards.rules import valid

    (on, _), _ = runs
    st = next(s for t in on for s in t["steps"] if s["action"] and "{window:" in json.dumps(s["action"]))
    ref = st["action"]
    with_numbers = Action(ref["name"], st["resolved_arguments"]).to_text()  # the window copied right
    with_ref = Action(ref["name"], ref["arguments"]).to_text()
    dangling = Action(ref["name"], {**ref["arguments"], "time_range": "{window:9}"}).to_text()
    cols = {
        "tools": [json.dumps(st["planner_input"]["tools"])] * 3,
        "ledger": [json.dumps(st["ledger_before"])] * 3,
        "prompts": [st["planner_input"]["messages"]] * 3,
    }
    assert valid([with_numbers, with_ref, dangling], **cols) == [1.0, 1.0, 0.0]
    assert valid([with_ref], tools=cols["tools"][:1], ledger=cols["ledger"][:1]) == [0.0]  # not offered: a string
    use_judge(build_judge({"kind": "offline"}))
    state = {"question": ["q"] * 3, "gold_answer": ["g"] * 3, "reference_action": [json.dumps(ref)] * 3}
    scores = asyncio.run(align([with_numbers, with_ref, dangling], **cols, **state))
    assert scores == [1.0, 1.0, 0.0]  # the reference is worth its window, resolved on both sides


# ---- a scripted planner over loopback -----------------------------------------------------------------------------


def test_a_planners_reference_reaches_the_tool_as_the_window_and_a_dangling_one_is_rejected():
    def frame(tr):
        return tool_call("frame_confirm", {"asset_id": "v1", "query": "banner", "time_range": tr, "need_index": 0})

    with FakeChatServer() as srv:
        srv.script("need_parser", needs_reply(NEEDS_WINDOW))
        web = tool_call("web_search", {"query": "Acme founded", "need_index": 1})
        srv.script("planner", frame("{window:1}"), frame("{window:0}"), web, tool_call("finish", {"answer": "1999"}))
        srv.script("critic", critic(updates=[fill(0, "Acme")]), critic("SUFFICIENT", [fill(1, "1999")]))
        srv.script("finalizer", text("1999"))
        srv.script("answer_critic", answer_critic(True))
        tb = FakeToolBox(ToolFailure, fallback=lambda n, a: "[40.0-44.0s] ACME")
        rec = run(srv, r0=R0_WINDOW, toolbox=tb, references=("window",))
    assert rec["outcome"] == "accepted"
    bad = rec["steps"][0]
    assert bad["action"] is None
    assert [e["error"] for e in bad["events"] if e["kind"] == "model_error"] == ["bad_arguments"]
    assert tb.calls[0] == (
        "frame_confirm",
        {"asset_id": "v1", "query": "banner", "time_range": [35.0, 50.0], "need_index": 0},
    )
    good = rec["steps"][1]
    assert good["action"]["arguments"]["time_range"] == "{window:0}"
    assert good["resolved_arguments"]["time_range"] == [35.0, 50.0]
    assert WINDOW_REFS_RULE in rec["steps"][0]["planner_input"]["messages"][0]["content"]
    assert window_stats([rec])["window_match_rate"] == 1.0
