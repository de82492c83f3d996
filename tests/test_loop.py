"""The runtime loop end to end: scripted fake OpenAI-compatible server on loopback, the real openai client."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from collect.config import EndpointConfig, RolesConfig, RuntimeConfig, ToolsConfig, from_mapping, load_config
from collect.ledger import event_from_dict, replay, state_hash
from collect.llm import ClientPool
from collect.loop import ToolFailure, record, run_task, start_run, step
from collect.roles.factory import build_roles
from collect.roles.openai_roles import parse_json_object, parse_verdict
from collect.run import load_task_corpus, load_task_list
from collect.teacher import make_teacher_roles
from collect.tools import ToolBox
from tests.fakes import FakeChatServer, FakeToolBox, empty, text, tool_call, truncated_tool_call
from tests.helpers.loop_script import (
    R0,
    all_events,
    answer_critic,
    critic,
    fill,
    kinds,
    needs_reply,
    run,
    script_anchor_then_year,
)


@pytest.fixture
def srv():
    with FakeChatServer() as s:
        s.script("need_parser", needs_reply())
        yield s


def test_clean_closure_is_accepted(closure_run):
    rec = closure_run
    assert rec["outcome"] == "accepted" and rec["answer"] == "1999"
    assert [s["action"] and s["action"]["name"] for s in rec["steps"]] == [
        "subtitle_grounding",
        None,  # the garbage reply: a ModelError step, no action
        "web_search",
        "finish",
    ]
    assert rec["final_ledger"]["needs"][1]["value"] == "1999"
    # the planner saw the raw observation of step 1 exactly once, at step 2
    obs1 = rec["steps"][0]["raw_observation"]
    assert obs1 in rec["steps"][1]["planner_input"]["messages"][1]["content"]
    assert all(obs1 not in s["planner_input"]["messages"][1]["content"] for s in rec["steps"][2:])
    assert rec["usage"]["planner"]["calls"] == 4 and rec["usage"]["planner"]["prompt_tokens"] > 0


def test_planner_input_is_reproducible_from_recorded_state(srv):
    from collect.ledger import ledger_from_dict
    from collect.roles.render import render_planner_messages

    srv.script(
        "planner", tool_call("web_search", {"query": "x", "need_index": 0}), tool_call("finish", {"answer": "1"})
    )
    srv.script("critic", critic())
    srv.script("finalizer", text("guess"))
    rec = run(srv, max_revisions=0)
    for s in rec["steps"]:
        led = ledger_from_dict(s["ledger_before"])
        again = render_planner_messages(
            R0, led, s["latest_observation"], "ledger", max_observation_chars=300, refs=RuntimeConfig().references
        )
        assert again == s["planner_input"]["messages"]


def test_blocked_finish_then_repair_is_repaired(srv):
    srv.script(
        "planner",
        tool_call("subtitle_grounding", {"query": "banner", "asset_id": "v1", "need_index": 0}),
        tool_call("web_search", {"query": "Acme founded", "need_index": 1}),
        tool_call("finish", {"answer": "maybe 1999?"}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", critic(updates=[fill(0, "Acme")]), critic("SUFFICIENT", [fill(1, "1999")]))
    srv.script("finalizer", text("probably around 1999"), text("1999"))
    srv.script("answer_critic", answer_critic(False, "Commit to one value."), answer_critic(True))
    rec = run(srv)
    assert rec["outcome"] == "repaired" and rec["answer"] == "1999"
    assert kinds(rec).count("finish_blocked") == 1
    # the blocked diagnosis reaches the planner's next input
    assert "Commit to one value." in rec["steps"][3]["planner_input"]["messages"][1]["content"]


def test_conflict_is_recorded_then_resolved_without_overwriting(srv):
    one = [{"need": "capital", "preferred_source": "web"}]
    srv._queues["need_parser"].clear()
    srv.script("need_parser", needs_reply(one))
    srv.script(
        "planner",
        *[tool_call("web_search", {"query": f"capital {k}", "need_index": 0}) for k in range(3)],
        tool_call("finish", {"answer": "Paris"}),
    )
    srv.script(
        "critic",
        critic("SUFFICIENT", [fill(0, "Paris")]),
        critic("CONFLICTING", [fill(0, "Lyon")]),
        critic("SUFFICIENT", [fill(0, "paris")]),
    )
    srv.script("finalizer", text("Paris"))
    srv.script("answer_critic", answer_critic(True))
    rec = run(srv)
    after_conflict = rec["steps"][1]["events"]
    led = replay([event_from_dict(e) for e in rec["initial_events"] + rec["steps"][0]["events"] + after_conflict])
    assert led.needs[0].value == "Paris" and led.needs[0].status == "partial"
    assert len(led.unresolved_conflicts()) == 1
    final = rec["final_ledger"]
    assert final["conflicts"][0]["resolved"] is True and final["needs"][0]["value"] == "paris"
    assert rec["outcome"] == "accepted"


def test_no_advancing_action_stops_as_insufficient(srv):
    srv.script("planner", *[tool_call("web_search", {"query": f"q{k}", "need_index": 0}) for k in range(3)])
    srv.script("critic", critic(), critic(), critic())
    rec = run(srv, unfillable_after=3)
    assert rec["outcome"] == "insufficient" and rec["answer"] is None
    assert len(rec["steps"]) == 3 and rec["final_events"][0]["outcome"] == "insufficient"
    assert rec["final_ledger"]["needs"][0]["status"] == "unfillable"
    assert rec["final_ledger"]["needs"][1]["status"] == "unfillable"  # propagated through depends_on


def test_revision_budget_spent_forces_the_answer(srv):
    srv.script("planner", tool_call("finish", {"answer": "x"}), tool_call("finish", {"answer": "y"}))
    srv.script("finalizer", text("1999"))
    rec = run(srv, max_revisions=1)
    assert rec["outcome"] == "forced" and rec["answer"] == "1999"
    assert kinds(rec) == ["needs_declared", "finish_blocked", "answer_accepted"]
    assert all_events(rec)[-1]["forced"] is True
    assert srv.role_requests("answer_critic") == []  # the gate blocked the first finish without drafting


def test_garbage_planner_output_becomes_model_errors_and_the_run_continues(srv):
    srv.script(
        "planner",
        text("I believe the answer is 1999."),
        text("<tool_call>{not json</tool_call>"),
        truncated_tool_call("web_search", {"query": "Acme founded year", "need_index": 1}),
        tool_call("teleport", {"where": "1999"}),
        tool_call("web_search", {"need_index": 1}),
        empty(),
        tool_call("subtitle_grounding", {"query": "banner", "asset_id": "v1", "need_index": 0}),
        tool_call("web_search", {"query": "Acme founded", "need_index": 1}),
        tool_call("finish", {"answer": "1999"}),
    )
    srv.script("critic", critic(updates=[fill(0, "Acme")]), critic("SUFFICIENT", [fill(1, "1999")]))
    srv.script("finalizer", text("1999"))
    srv.script("answer_critic", answer_critic(True))
    rec = run(srv)
    errs = [e["error"] for e in all_events(rec) if e["kind"] == "model_error"]
    assert errs == ["no_action", "unparseable", "unparseable", "unknown_tool", "bad_arguments", "no_action"]
    assert rec["outcome"] == "accepted" and rec["final_ledger"]["model_errors"] == 6
    assert "rejected (unknown_tool)" in rec["steps"][4]["planner_input"]["messages"][1]["content"]


def _script_reversed_ranges_then_answer(srv, n_bad: int):
    """The planner sends `n_bad` subtitle calls whose time range ends before it starts (rejected), then the fixed
    call, a web search and the answer 1999, which the critics accept."""
    bad = {"query": "banner", "asset_id": "v1", "time_range": [60.0, 30.0], "need_index": 0}
    script_anchor_then_year(
        srv,
        *[tool_call("subtitle_grounding", bad)] * n_bad,
        tool_call("subtitle_grounding", bad | {"time_range": [30.0, 60.0]}),
        tool_call("web_search", {"query": "Acme founded", "need_index": 1}),
        tool_call("finish", {"answer": "1999"}),
    )


def test_a_reversed_time_range_is_a_rejected_reply_not_a_failed_attempt_on_the_need(srv):
    # schema-valid, but it ends before it starts: three of these used to be tool errors that made the need unfillable
    tb = FakeToolBox(ToolFailure, fallback=lambda n, a: "[40.0-44.0s] The banner reads ACME.")
    _script_reversed_ranges_then_answer(srv, 3)
    rec = run(srv, toolbox=tb)
    errs = [e for e in all_events(rec) if e["kind"] in ("model_error", "tool_error")]
    assert [e["error"] for e in errs] == ["bad_arguments"] * 3 and "ends before it starts" in errs[0]["detail"]
    assert rec["steps"][3]["ledger_before"]["needs"][0]["attempts"] == 0  # no attempt was charged to the need
    assert [c[0] for c in tb.calls] == ["subtitle_grounding", "web_search"]  # the tool never saw the bad ranges
    assert rec["outcome"] == "accepted" and rec["final_ledger"]["tool_errors"] == 0
    from collect.summary import planner_step_stats

    st = planner_step_stats([rec])  # the figures eval reports: 3 of 6 calls rejected, all in this one run
    assert (st["planner_calls"], st["valid_actions"], st["tasks_with_rejected_reply"]) == (6, 3, 1)
    assert st["most_rejected_in_one_task"] == 3


def test_after_a_rejected_reply_the_planner_is_asked_again_with_its_own_decoding(srv):
    _script_reversed_ranges_then_answer(srv, 2)
    rec = run(srv)
    assert rec["outcome"] == "accepted"
    sent = [(b["temperature"], b.get("seed")) for b in srv.role_requests("planner")]
    assert sent == [(0.0, None)] * 5 and all("sampling" not in s for s in rec["steps"])


def test_a_repeat_of_a_call_that_made_no_progress_goes_to_the_tool_and_the_critic_as_the_paper_does(srv):
    from collect.ledger import call_signature, canonical_args

    sub = {"query": "banner", "asset_id": "v1", "need_index": 0}
    search = {"query": "Acme founded", "need_index": 1}
    srv.script("planner", tool_call("subtitle_grounding", sub), *[tool_call("web_search", search)] * 2)
    srv.script("planner", tool_call("web_search", {"query": "Acme founding year", "need_index": 1}))
    srv.script("planner", tool_call("finish", {"answer": "1999"}))
    # the first search finds nothing; the identical second one finds nothing again; the reworded one fills it
    srv.script("critic", critic(updates=[fill(0, "Acme")]), critic(), critic())
    srv.script("critic", critic("SUFFICIENT", [fill(1, "1999")]))
    srv.script("finalizer", text("1999"))
    srv.script("answer_critic", answer_critic(True))
    rec = run(srv)
    assert rec["outcome"] == "accepted"
    assert len(srv.role_requests("critic")) == 4  # the repeat reached the tool and the critic
    third = rec["steps"][2]
    assert call_signature("web_search", canonical_args(search)) in third["ledger_before"]["failed_calls"]
    assert [e for e in third["events"] if e["kind"] == "model_error"] == []
    assert third["action"]["arguments"] == search


def test_unreadable_critic_output_is_an_insufficient_verdict_and_a_critic_model_error(srv):
    srv.script(
        "planner", tool_call("web_search", {"query": "a", "need_index": 0}), tool_call("finish", {"answer": "?"})
    )
    srv.script("critic", text("I cannot decide, sorry."))
    srv.script("finalizer", text("unknown"))
    rec = run(srv, max_revisions=0)
    ev = rec["steps"][0]["events"]
    assert [e["kind"] for e in ev] == ["model_error", "observation_committed"]
    assert ev[0]["role"] == "critic" and ev[1]["verdict"]["verdict"] == "INSUFFICIENT"
    assert len(ev[1]["verdict"]["updates"]) == 0 and rec["faults"].get("malformed") == 1


def test_tool_failure_becomes_tool_error_event(srv):
    tb = FakeToolBox(ToolFailure).queue("web_search", ToolFailure("search backend down"))
    srv.script(
        "planner", tool_call("web_search", {"query": "a", "need_index": 0}), tool_call("finish", {"answer": "?"})
    )
    srv.script("finalizer", text("unknown"))
    rec = run(srv, toolbox=tb, max_revisions=0)
    ev = rec["steps"][0]["events"][0]
    assert ev["kind"] == "tool_error" and "backend down" in ev["error"] and rec["final_ledger"]["tool_errors"] == 1


def _long_run(srv, arm):
    srv.default("planner", tool_call("web_search", {"query": "Acme"}))
    srv.default("critic", critic(desc="the founding year is not in the results so far"))
    srv.default("summarizer", text("Searched for Acme; no founding year yet."))
    tb = FakeToolBox(ToolFailure, fallback=lambda n, a: "result line about Acme and its history. " * 40)
    return run(srv, toolbox=tb, arm=arm, max_steps=15, max_observation_chars=400)


@pytest.mark.parametrize("arm", ["ledger", "react"])
def test_ledger_context_stays_flat_while_react_grows(srv, arm):
    rec = _long_run(srv, arm)
    assert rec["outcome"] == "budget_exhausted" and len(rec["steps"]) == 15
    size = [len(json.dumps(s["planner_input"]["messages"])) for s in rec["steps"]]
    if arm == "ledger":
        assert size[14] <= 1.3 * size[0], size
    else:
        assert size[14] > 2 * size[0], size


def test_memory_arm_summary_is_capped_and_replaces_the_digest(srv):
    srv.default("summarizer", text("S" * 100000))
    rec = _long_run(srv, "memory")
    assert rec["outcome"] == "budget_exhausted"
    s2 = rec["steps"][1]
    user = s2["planner_input"]["messages"][1]["content"]
    assert "Evidence state digest" not in user and "Summary so far" in user
    assert 0 < len(rec["steps"][0]["summary"]) < 5000


def test_react_finish_returns_immediately_without_gate_or_answer_critic(srv):
    srv.script("planner", tool_call("finish", {"answer": "1999"}))
    rec = run(srv, arm="react")
    assert rec["outcome"] == "accepted" and rec["answer"] == "1999"
    assert srv.role_requests("finalizer") == [] and srv.role_requests("answer_critic") == []


def test_replayed_events_reproduce_every_step_hash(closure_run):
    rec = closure_run
    evs = [event_from_dict(e) for e in rec["initial_events"]]
    for s in rec["steps"]:
        evs += [event_from_dict(e) for e in s["events"]]
        assert state_hash(replay(evs)) == s["ledger_hash"]
    assert state_hash(replay(evs)) == rec["final_ledger_hash"]


def test_api_key_never_reaches_the_trajectory(srv, monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-secret-123")
    srv.script("planner", tool_call("finish", {"answer": "x"}))
    srv.script("finalizer", text("x"))

    async def go():
        ep = {"fake": EndpointConfig(base_url=srv.base_url, model="m", api_key_env="FAKE_KEY", max_retries=0)}
        pool = ClientPool(ep)
        roles = build_roles(R0, RolesConfig.from_dict({r: "fake" for r in RolesConfig().as_dict()}), ep, pool)
        rec = await run_task(R0, roles, FakeToolBox(ToolFailure), RuntimeConfig(max_revisions=0))
        assert "sk-secret" not in repr(pool.client("fake")) + repr(ep)
        await pool.close()
        return rec

    assert "sk-secret" not in json.dumps(asyncio.run(go()))


@pytest.mark.parametrize(
    "reply",
    [
        '```json\n{"verdict": "SUFFICIENT", "updated_need_statuses": [{"need_index": 0, "status": "filled", '
        '"value": "7"}]}\n```',
        'Here is my verdict: {"verdict": "SUFFICIENT", "updated_need_statuses": [{"need_index": 0, "status": '
        '"filled", "value": "7",},],} hope it helps',
        "{'verdict': 'SUFFICIENT', 'updated_need_statuses': [{'need_index': 0, 'status': 'filled', 'value': '7'}]}",
    ],
)
def test_critic_json_is_read_through_fences_prose_single_quotes_and_trailing_commas(reply):
    v = parse_verdict(reply)
    assert v.verdict == "SUFFICIENT" and v.updates[0].value == "7" and v.updates[0].status == "filled"


def test_critic_parse_failure_returns_none_and_bad_entries_are_dropped():
    assert parse_json_object("no json here") is None and parse_verdict("[1, 2]") is None
    v = parse_verdict(
        '{"verdict": "maybe", "updated_need_statuses": [{"need_index": "x"}, {"need_index": 1, '
        '"status": "weird"}, {"need_index": 2, "status": "partial"}]}'
    )
    assert v.verdict == "INSUFFICIENT" and [u.need_index for u in v.updates] == [2]


def test_runtime_config_rejects_unknown_names_naming_the_field():
    with pytest.raises(ValueError, match="RuntimeConfig.arm"):
        RuntimeConfig(arm="reflexion")
    with pytest.raises(ValueError, match="unknown role"):
        RolesConfig.from_dict({"plannr": "offline"})
    with pytest.raises(ValueError, match="RolesConfig.critic"):
        RolesConfig(critic="nowhere").check_endpoints({})


@pytest.mark.parametrize("arm", ["ledger", "react"])
def test_a_forked_run_steps_on_its_own_and_ends_as_the_run_would(arm):
    """Run.fork between two steps (what rl.online does at an anchor state): stepping the fork to its end leaves the
    run where it was (ledger, steps, the react arm's history), and either ends as run_task does from S_0."""
    cfg = load_config("configs/collect/embedded.yaml", {"split": "train", "limit": 1, "progress": False})
    runtime = dataclasses.replace(cfg.runtime, arm=arm)
    [task] = load_task_list(cfg)
    toolbox = ToolBox(task, task.to_context(), from_mapping(ToolsConfig, cfg.tools, "tools"), load_task_corpus(cfg))

    async def go():
        whole = await run_task(task, make_teacher_roles(task), toolbox, runtime)
        run = await start_run(task.to_context(), make_teacher_roles(task), toolbox, runtime)
        await step(run, toolbox)
        before = (state_hash(run.ledger), len(run.steps), len(run.arm.history) if arm == "react" else None)
        fork = run.fork()
        while not fork.ledger.done:
            await step(fork, toolbox)
        after = (state_hash(run.ledger), len(run.steps), len(run.arm.history) if arm == "react" else None)
        while not run.ledger.done:
            await step(run, toolbox)
        return whole, before, after, record(fork, task.answer), record(run, task.answer)

    whole, before, after, forked, rest = asyncio.run(go())
    assert before == after and len(whole["steps"]) >= 3
    for rec in (forked, rest):
        assert rec["outcome"] == whole["outcome"] and rec["answer"] == whole["answer"]
        assert rec["final_ledger_hash"] == whole["final_ledger_hash"]
        assert [s["ledger_hash"] for s in rec["steps"]] == [s["ledger_hash"] for s in whole["steps"]]
        assert [s["planner_input"] for s in rec["steps"]] == [s["planner_input"] for s in whole["steps"]]
