"""Focus references (RuntimeConfig.references "focus"): "{focus:K}" in a query stands for need K's query_focus, so a
planner names what to search for by index instead of copying the phrase (the tuned window-reference planners'
remaining failures are second web searches with another need's phrase or a training task's: docs/training.md "Focus
references").

Checked on the resolver (one pass with value references; hostile values), on the real loop (the shipped recipe with
the option on, the offline teacher), harvest, relabelling and the rewards, and on a scripted OpenAI-compatible
planner over loopback, against the same runs with the option off."""

from __future__ import annotations

import asyncio
import json

import pytest

from collect.actions import (
    REFERENCE_KINDS,
    REFERENCE_RULES,
    Action,
    ActionError,
    focus_formula,
    offered_refs,
    reference_kinds,
    resolve_text_refs,
    write_focus_refs,
    write_value_refs,
)
from collect.compute import program
from collect.config import ConfigError, RuntimeConfig, load_config
from collect.loop import ToolFailure
from tests.fakes import FakeChatServer, FakeToolBox, text, tool_call
from tests.helpers.loop_script import NEEDS, R0, answer_critic, critic, fill, needs_reply, run
from tests.helpers.teacher_collect import (
    ROOT,
    collect_refs,
    harvested_decisions,
    relabelled_with_and_without,
    same_calls_with_and_without,
)

N_TASKS = 30
FOCUS_REFS_RULE = REFERENCE_RULES["focus"]
FOCUSES = {
    0: "name of the museum between 50 s and 65 s",
    1: "number of exhibition halls",
    2: "display cases",
    3: "compute: to_num(v1) * to_num(v2)",
}
VALUES = {0: "Selessmere Museum of Crafts"}


# ---- the resolver --------------------------------------------------------------------------------------------------


def test_a_focus_reference_becomes_the_needs_focus_in_the_same_pass_as_a_value_reference():
    a = Action("web_search", {"query": "{need:0} {focus:1}", "need_index": 1})
    got = resolve_text_refs(a, VALUES, FOCUSES)
    assert got.arguments == {"query": "Selessmere Museum of Crafts number of exhibition halls", "need_index": 1}
    # not offered: literal text, left for the tool (and the judge) to see as written
    assert resolve_text_refs(a, VALUES, None).arguments["query"] == "Selessmere Museum of Crafts {focus:1}"
    assert resolve_text_refs(a, None, FOCUSES).arguments["query"] == "{need:0} number of exhibition halls"


def test_in_code_a_focus_reference_is_the_formula_of_a_computation_need():
    code = Action("code_executor", {"code": "v = {need:0}\nprint(fmt({focus:3}))", "need_index": 3})
    got = resolve_text_refs(code, VALUES, FOCUSES)
    assert got.arguments["code"] == "v = 'Selessmere Museum of Crafts'\nprint(fmt(to_num(v1) * to_num(v2)))"
    not_a_formula = Action("code_executor", {"code": "print({focus:1})", "need_index": 3})
    with pytest.raises(ActionError) as e:
        resolve_text_refs(not_a_formula, VALUES, FOCUSES)
    assert "{focus:1} names need 1, which names no formula (needs with one: 3)" in e.value.detail
    assert focus_formula(" compute:  round(to_num(v1), 2) ") == "round(to_num(v1), 2)"
    assert focus_formula("number of exhibition halls") is None


def test_a_value_that_holds_a_reference_is_not_resolved_again():
    hostile = {0: "{focus:9} and {need:0}"}  # a web page can say anything; the ledger keeps what the critic read
    a = Action("web_search", {"query": "{need:0} {focus:1}", "need_index": 1})
    got = resolve_text_refs(a, hostile, FOCUSES)
    assert got.arguments["query"] == "{focus:9} and {need:0} number of exhibition halls"


@pytest.mark.parametrize("q", ["{focus:7}", "{need:0} {focus:4} x"])
def test_a_reference_to_a_need_without_a_focus_is_a_bad_argument_naming_the_ones_with_one(q):
    a = Action("web_search", {"query": q, "need_index": 1})
    with pytest.raises(ActionError) as e:
        resolve_text_refs(a, VALUES, FOCUSES)
    assert e.value.kind == "bad_arguments"
    assert "which has no query focus (needs with one: 0, 1, 2, 3)" in e.value.detail


def test_the_teacher_writes_its_target_needs_focus_after_the_values_and_it_resolves_back():
    plain = Action("web_search", {"query": "Selessmere Museum of Crafts number of exhibition halls", "need_index": 1})
    w = write_focus_refs(write_value_refs(plain, VALUES), FOCUSES)
    assert w.arguments["query"] == "{need:0} {focus:1}"
    assert resolve_text_refs(w, VALUES, FOCUSES) == plain
    other = Action("web_search", {"query": "Selessmere Museum of Crafts display cases", "need_index": 1})
    assert write_focus_refs(other, FOCUSES) is other  # need 2's focus, not the call's need: left as written
    braces = Action("web_search", {"query": "a {b} c", "need_index": 0})
    assert write_focus_refs(braces, {0: "{b}"}) is braces  # a focus with braces could overlap a reference
    values = {1: "5", 2: "360"}
    prog = Action("code_executor", {"code": program("to_num(v1) * to_num(v2)", values), "need_index": 3})
    w = write_focus_refs(write_value_refs(prog, values), FOCUSES)
    assert w.arguments["code"].endswith("v1 = {need:1}\nv2 = {need:2}\nprint(fmt({focus:3}))\n")
    assert resolve_text_refs(w, values, FOCUSES) == prog


def test_the_prompt_says_which_references_it_offers():
    msgs = [{"role": "system", "content": "rules\n" + FOCUS_REFS_RULE}, {"role": "user", "content": "q"}]
    assert offered_refs(msgs) == ("focus",)
    assert offered_refs("<|im_start|>system\nrules\n" + FOCUS_REFS_RULE.strip() + "<|im_end|>") == ("focus",)
    assert offered_refs([{"role": "user", "content": FOCUS_REFS_RULE}]) == ()  # only the system prompt offers
    everything = "rules\n" + "".join(REFERENCE_RULES[k] for k in REFERENCE_KINDS)
    assert offered_refs([{"role": "system", "content": everything}]) == REFERENCE_KINDS


def test_references_are_one_key_with_every_kind_on_by_default_and_the_papers_runtime_as_the_empty_list(tmp_path):
    assert RuntimeConfig().references == REFERENCE_KINDS == ("need", "window", "focus")
    assert load_config(ROOT / "configs/collect/embedded_1800.yaml", {}).runtime.references == REFERENCE_KINDS
    assert load_config(ROOT / "configs/collect/omnigaia_api.yaml", {}).runtime.references == ()
    assert reference_kinds(["focus", "need", "focus"]) == ("need", "focus")  # the prompt's order, each once
    p = tmp_path / "r.yaml"
    p.write_text("runtime: {references: [need, focuss]}\n")
    with pytest.raises(ConfigError, match=r"r.yaml: .*unknown reference kind 'focuss'.*did you mean 'focus'"):
        load_config(p)
    p.write_text("runtime: {references: need}\n")
    with pytest.raises(ConfigError, match=r"runtime.references: expected a list of strings"):
        load_config(p)


# ---- the real loop, the offline teacher, harvest, relabelling, rewards ---------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("frefs")
    on = collect_refs(d / "on", N_TASKS, REFERENCE_KINDS)
    return on, collect_refs(d / "off", N_TASKS, ("need", "window"))


def test_the_teacher_names_focuses_and_the_tools_get_the_same_queries(runs):
    (on, on_dir), (off, _) = runs
    written = same_calls_with_and_without(on, off, "focus", "{focus:")
    assert written >= N_TASKS  # every task searches at least once
    programs = [s["action"] for t in on for s in t["steps"] if (s["action"] or {}).get("name") == "code_executor"]
    assert programs and all("print(fmt({focus:" in p["arguments"]["code"] for p in programs)
    decisions = harvested_decisions(on_dir)
    assert sum("{focus:" in json.dumps(r["completion"]) for r in decisions) >= N_TASKS
    assert all(FOCUS_REFS_RULE in r["prompt"][0]["content"] for r in decisions)


def test_relabelling_writes_focus_references_only_where_the_students_prompt_offers_them(runs):
    (on, _), (off, _) = runs
    assert relabelled_with_and_without(on, off, "{focus:") >= N_TASKS


def test_rewards_resolve_focus_references_where_the_prompt_offers_them(runs):
    from rewards import build_judge, use_judge
    from rewards.judge import align, target
    from rewards.rules import valid

    (on, _), _ = runs
    st = next(s for t in on for s in t["steps"] if s["action"] and "{focus:" in json.dumps(s["action"]))
    ref = st["action"]
    ni = ref["arguments"]["need_index"]
    copied = Action(ref["name"], st["resolved_arguments"]).to_text()  # the phrase copied right
    with_ref = Action(ref["name"], ref["arguments"]).to_text()
    dangling = Action(ref["name"], {**ref["arguments"], "query": "{focus:9}"}).to_text()
    wrong_need = Action(ref["name"], {**ref["arguments"], "query": f"{{focus:{ni}}} {{focus:{ni}}}"}).to_text()
    cols = {
        "tools": [json.dumps(st["planner_input"]["tools"])] * 4,
        "ledger": [json.dumps(st["ledger_before"])] * 4,
        "prompts": [st["planner_input"]["messages"]] * 4,
    }
    assert valid([copied, with_ref, dangling, wrong_need], **cols) == [1.0, 1.0, 0.0, 1.0]
    use_judge(build_judge({"kind": "offline"}))
    state = {"question": ["q"] * 4, "gold_answer": ["g"] * 4, "reference_action": [json.dumps(ref)] * 4}
    scores = asyncio.run(align([copied, with_ref, dangling, wrong_need], **cols, **state))
    assert scores[0] == scores[1] == 1.0 and scores[2] == 0.0  # worth its phrase, resolved on both sides
    two = {k: v[:2] for k, v in {**cols, **state}.items()}
    assert asyncio.run(target([copied, with_ref], **two)) == [1.0, 1.0]


# ---- a scripted planner over loopback -----------------------------------------------------------------------------


def test_a_planners_reference_reaches_the_tool_as_the_focus_and_a_dangling_one_is_rejected():
    with FakeChatServer() as srv:
        srv.script("need_parser", needs_reply(NEEDS))
        sub = tool_call("subtitle_grounding", {"asset_id": "v1", "query": "{focus:0} sign", "need_index": 0})
        bad = tool_call("web_search", {"query": "{need:0} {focus:5}", "need_index": 1})
        web = tool_call("web_search", {"query": "{need:0} {focus:1}", "need_index": 1})
        srv.script("planner", sub, bad, web, tool_call("finish", {"answer": "1999"}))
        srv.script("critic", critic(updates=[fill(0, "Acme")]), critic("SUFFICIENT", [fill(1, "1999")]))
        srv.script("finalizer", text("1999"))
        srv.script("answer_critic", answer_critic(True))
        tb = FakeToolBox(ToolFailure, fallback=lambda n, a: "[40.0-44.0s] ACME")
        rec = run(srv, r0=R0, toolbox=tb, references=("need", "focus"))
    assert rec["outcome"] == "accepted"
    assert tb.calls[0] == ("subtitle_grounding", {"asset_id": "v1", "query": "banner sign", "need_index": 0})
    rejected = rec["steps"][1]
    assert rejected["action"] is None
    assert [e["error"] for e in rejected["events"] if e["kind"] == "model_error"] == ["bad_arguments"]
    assert "{focus:5} names need 5, which has no query focus" in rec["steps"][2]["latest_observation"]
    assert tb.calls[1] == ("web_search", {"query": "Acme founded", "need_index": 1})
    good = rec["steps"][2]
    assert good["action"]["arguments"]["query"] == "{need:0} {focus:1}"
    assert good["resolved_arguments"]["query"] == "Acme founded"
    assert FOCUS_REFS_RULE in rec["steps"][0]["planner_input"]["messages"][0]["content"]
