"""Value references (RuntimeConfig.references "need"): "{need:K}" in a query stands for need K's filled value, in code
for its Python literal.

Checked on the real loop (the shipped recipe configs/collect/embedded_1800.yaml, the offline teacher), on a
scripted OpenAI-compatible planner over loopback (references it gets wrong included), on relabelling and on the
rewards, against the same runs with the option off."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from pathlib import Path

import pytest

from collect.actions import REFERENCE_RULES, Action, ActionError, offered_refs, resolve_text_refs, write_value_refs
from collect.loop import ToolFailure
from tests.fakes import FakeChatServer, FakeToolBox, tool_call
from tests.helpers.loop_script import needs_reply, run, script_anchor_then_year
from tests.helpers.teacher_collect import collect_refs

ROOT = Path(__file__).resolve().parents[1]
N_TASKS = 30
VALUE_REFS_RULE = REFERENCE_RULES["need"]


def resolve_value_refs(action: Action, values: dict[int, str]) -> Action:
    return resolve_text_refs(action, values, None)  # value references alone


def offers_value_refs(prompt) -> bool:
    return "need" in offered_refs(prompt)


# ---- the resolver --------------------------------------------------------------------------------------------------


def test_a_reference_is_replaced_by_the_needs_value_and_nothing_else_changes():
    a = Action("web_search", {"query": "{need:0} market town {need:2}", "need_index": 3})
    got = resolve_value_refs(a, {0: "Kovdale Growers' Cooperative", 2: "1999"})
    assert got.arguments == {"query": "Kovdale Growers' Cooperative market town 1999", "need_index": 3}
    plain = Action("web_search", {"query": "Kovdale market town", "need_index": 1})
    assert resolve_value_refs(plain, {0: "x"}) is plain  # no reference: the very same action
    literal = Action("code_executor", {"code": "print('{need: 0}')", "need_index": 1})
    assert resolve_value_refs(literal, {0: "x"}) is literal  # a near-miss is text, in code too


def test_in_code_a_reference_is_the_values_python_literal_and_runs():
    from collect.compute import HELPERS_SRC

    values = {0: "84.75 Orrin crowns", 1: 'it\'s 19 \\ "quoted"\n', 2: "unused"}
    code = "v0 = {need:0}\nv1 = {need:1}\nprint(fmt(to_num(v0) * 2), len(v1))\n"
    got = resolve_value_refs(Action("code_executor", {"code": code, "need_index": 3}), values)
    assert got.arguments["code"].startswith(f"v0 = {values[0]!r}\nv1 = {values[1]!r}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(HELPERS_SRC + got.arguments["code"], {})  # the quotes and backslashes in a value cannot break the code
    assert out.getvalue() == f"169.5 {len(values[1])}\n"
    with pytest.raises(ActionError, match="code_executor.code: {need:2}"):
        resolve_value_refs(Action("code_executor", {"code": "x = {need:2}", "need_index": 3}), {0: "a"})


def test_the_teachers_program_is_written_with_references_and_resolves_back():
    from collect.compute import program

    values = {1: "19", 2: "84.75 Orrin crowns", 4: "1 March 1999"}
    code = program("to_num(v2) - to_num(v1)", values)
    a = Action("code_executor", {"code": code, "need_index": 5})
    written = write_value_refs(a, values)
    lines = written.arguments["code"].splitlines()
    assert [ln for ln in lines if ln.startswith("v")] == ["v1 = {need:1}", "v2 = {need:2}", "v4 = {need:4}"]
    assert "'19'" not in written.arguments["code"]
    assert resolve_value_refs(written, values) == a


@pytest.mark.parametrize(
    "query", ["{need:1} town", "{need:7}", "{need:99999999999999999999} x", "a {need:0} {need:1}"]
)
def test_a_reference_to_a_need_without_a_value_is_a_bad_argument_naming_it(query):
    with pytest.raises(ActionError) as e:
        resolve_value_refs(Action("web_search", {"query": query, "need_index": 1}), {0: "Acme"})
    assert e.value.kind == "bad_arguments" and "which has no value" in e.value.detail
    assert "needs with a value: 0" in e.value.detail


def test_resolution_is_one_pass_and_malformed_references_stay_text():
    # a value that itself looks like a reference is not expanded again; near-misses are literal text
    a = Action("web_search", {"query": "{need:0} {need: 1} {need:x} {need:1", "need_index": 2})
    got = resolve_value_refs(a, {0: "{need:1}", 1: "never"})
    assert got.arguments["query"] == "{need:1} {need: 1} {need:x} {need:1"


def test_write_then_resolve_gives_back_the_teachers_query():
    values = {0: "Kovdale", 1: "Kovdale Growers' Cooperative"}
    a = Action("web_search", {"query": "Kovdale Growers' Cooperative market town", "need_index": 2})
    written = write_value_refs(a, values)
    assert written.arguments["query"] == "{need:1} market town"  # the longest value first
    assert resolve_value_refs(written, values) == a


# ---- the real loop, the offline teacher and harvest ---------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("refs")
    return collect_refs(d / "on", N_TASKS, ("need",)), collect_refs(d / "off", N_TASKS, ())


def test_the_teacher_writes_references_and_the_tools_get_the_values(runs):
    (on, on_dir), (off, _) = runs
    assert [r["task_id"] for r in on] == [r["task_id"] for r in off]
    # the same outcomes and answers, step for step the same tool calls once resolved
    assert [(r["outcome"], r["answer"], r["correct"]) for r in on] == [
        (r["outcome"], r["answer"], r["correct"]) for r in off
    ]
    written = resolved = 0
    for a, b in zip(on, off, strict=True):
        assert len(a["steps"]) == len(b["steps"])
        for sa, sb in zip(a["steps"], b["steps"], strict=True):
            assert offers_value_refs(sa["planner_input"]["messages"]) and not offers_value_refs(
                sb["planner_input"]["messages"]
            )
            assert "resolved_arguments" not in sb and "{need:" not in json.dumps(sb["action"])
            args = sa.get("resolved_arguments", sa["action"]["arguments"])
            assert args == sb["action"]["arguments"]  # what the tool was called with
            if "{need:" in json.dumps(sa["action"]):
                written += 1
                resolved += "resolved_arguments" in sa and "{need:" not in json.dumps(sa["resolved_arguments"])
    assert written >= 5 and resolved == written  # web searches on an upstream value, among others
    assert sum(r["correct"] is True for r in on) >= N_TASKS - 1
    # the SFT rows train on the written form: the references, not the values
    from collect.harvest import harvest

    harvest(on_dir / "trajectories.jsonl", on_dir / "data", eval_share=0.0)
    rows = [json.loads(x) for x in (on_dir / "data" / "sft.train.jsonl").read_text().splitlines()]
    completions = [json.dumps(r["completion"]) for r in rows if r["kind"] == "decision"]
    assert sum("{need:" in c for c in completions) >= 3
    assert all(VALUE_REFS_RULE in r["prompt"][0]["content"] for r in rows if r["kind"] == "decision")
    from pipeline.report import task_viewer  # the report's task viewer shows what the tool got

    assert "resolved arguments" in task_viewer(on) and "resolved arguments" not in task_viewer(off)


def test_relabelling_labels_with_references_only_where_the_students_prompt_offers_them(runs):
    from collections import Counter

    from pipeline.relabel import relabel_trajectory

    (on, _), (off, _) = runs
    rows_on = [row for t in on for row in relabel_trajectory(t, 1, Counter())[0]]
    rows_off = [row for t in off for row in relabel_trajectory(t, 1, Counter())[0]]
    assert sum("{need:" in json.dumps(r["completion"]) for r in rows_on) >= 5
    assert not any("{need:" in json.dumps(r["completion"]) for r in rows_off)


def test_rewards_resolve_references_where_the_prompt_offers_them(runs):
    from rewards import build_judge, use_judge
    from rewards.judge import JudgeConfig, target
    from rewards.rules import valid

    (on, _), _ = runs
    states = [
        (s, t) for t in on for s in t["steps"] if s["action"] and "{need:" in s["action"]["arguments"].get("query", "")
    ]
    st = states[0][0]
    tools = json.dumps(st["planner_input"]["tools"])
    ledger = json.dumps(st["ledger_before"])
    prompt = st["planner_input"]["messages"]
    ref = st["action"]
    with_value = Action(ref["name"], st["resolved_arguments"]).to_text()  # the value copied right
    with_ref = Action(ref["name"], ref["arguments"]).to_text()
    dangling = Action(ref["name"], {**ref["arguments"], "query": "{need:9} town"}).to_text()
    cols = {"tools": [tools] * 3, "ledger": [ledger] * 3, "prompts": [prompt] * 3}
    assert valid([with_value, with_ref, dangling], **cols) == [1.0, 1.0, 0.0]
    # without the offer (no prompts), "{need:9}" is literal text: a valid query
    assert valid([dangling], tools=[tools], ledger=[ledger]) == [1.0]
    use_judge(build_judge(JudgeConfig()))  # the offline judge: reads the ledger, compares with the reference
    state = {"question": ["q"] * 3, "gold_answer": ["g"] * 3, "reference_action": [json.dumps(ref)] * 3}
    scores = asyncio.run(target([with_value, with_ref, dangling], **cols, **state))
    assert scores[0] == scores[1] > 0 and scores[2] == 0.0  # a reference is worth its value; a dangling one nothing


# ---- a scripted planner over loopback -----------------------------------------------------------------------------


@pytest.fixture
def srv():
    with FakeChatServer() as s:
        s.script("need_parser", needs_reply())
        yield s


SUBTITLE = tool_call("subtitle_grounding", {"query": "banner", "asset_id": "v1", "need_index": 0})
BY_REF = tool_call("web_search", {"query": "{need:0} founded", "need_index": 1})
FINISH = tool_call("finish", {"answer": "1999"})


def test_a_planner_reference_to_an_unfilled_need_is_rejected_and_a_good_one_reaches_the_tool(srv):
    tb = FakeToolBox(ToolFailure, fallback=lambda n, a: "[40.0-44.0s] The banner reads ACME.")
    dangling = tool_call("web_search", {"query": "{need:1} history", "need_index": 1})  # need 1: the one looked for
    script_anchor_then_year(srv, SUBTITLE, dangling, BY_REF, FINISH, anchor="Acme Mills")
    rec = run(srv, toolbox=tb, references=("need",))
    assert rec["outcome"] == "accepted"
    bad = rec["steps"][1]
    errs = [e for e in bad["events"] if e["kind"] == "model_error"]
    assert [e["error"] for e in errs] == ["bad_arguments"] and "{need:1}" in errs[0]["detail"]
    assert bad["action"] is None and "Your previous reply was rejected" in rec["steps"][2]["latest_observation"]
    good = rec["steps"][2]
    assert good["action"]["arguments"]["query"] == "{need:0} founded"
    assert good["resolved_arguments"]["query"] == "Acme Mills founded"
    assert tb.calls[-1] == ("web_search", {"query": "Acme Mills founded", "need_index": 1})
    assert VALUE_REFS_RULE in rec["steps"][0]["planner_input"]["messages"][0]["content"]


def test_off_a_reference_is_literal_text_sent_to_the_tool(srv):
    tb = FakeToolBox(ToolFailure, fallback=lambda n, a: "[40.0-44.0s] The banner reads ACME.")
    script_anchor_then_year(srv, SUBTITLE, BY_REF, FINISH, anchor="Acme Mills")
    rec = run(srv, toolbox=tb, references=())
    assert tb.calls[-1] == ("web_search", {"query": "{need:0} founded", "need_index": 1})
    assert all("resolved_arguments" not in s for s in rec["steps"])
    assert VALUE_REFS_RULE not in rec["steps"][0]["planner_input"]["messages"][0]["content"]


# ---- GRPO's path: prompts rendered by the real Qwen chat templates ------------------------------------------------


@pytest.mark.parametrize("template", sorted(p.name for p in (ROOT / "tests/fixtures/chat_templates").glob("*.jinja")))
def test_the_offer_survives_every_real_chat_template_and_the_valid_reward_reads_it(runs, template):
    """rl.train renders each state's messages with the policy's chat template and GRPO hands that text to the
    rewards: the rule must still be found in it (public Qwen templates, tests/fixtures/chat_templates)."""
    from rewards.rules import valid
    from sft.tiny import train_tokenizer

    (on, _), (off, _) = runs
    step = next(s for t in on for s in t["steps"] if "resolved_arguments" in s)
    off_step = off[0]["steps"][0]
    tok = train_tokenizer([json.dumps(step["planner_input"])], vocab_size=400)
    tpl = (ROOT / "tests/fixtures/chat_templates" / template).read_text()

    def render(st):
        return tok.apply_chat_template(
            st["planner_input"]["messages"],
            tools=st["planner_input"]["tools"],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=tpl,
        )

    text, off_text = render(step), render(off_step)
    assert offers_value_refs(text) and not offers_value_refs(off_text)
    ref = Action(step["action"]["name"], step["action"]["arguments"]).to_text()
    dangling = Action(step["action"]["name"], {**step["action"]["arguments"], "query": "{need:9} town"}).to_text()
    tools, ledger = json.dumps(step["planner_input"]["tools"]), json.dumps(step["ledger_before"])
    cols = {"tools": [tools] * 2, "ledger": [ledger] * 2}
    assert valid([ref, dangling], prompts=[text] * 2, **cols) == [1.0, 0.0]
    assert valid([ref, dangling], prompts=[off_text] * 2, **cols) == [1.0, 1.0]  # not offered: literal text
