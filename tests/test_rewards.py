"""Closure-aligned rewards on literal completions: rules (valid, gate), the judge (skip-on-failure, one call per
candidate, cache) and the offline judge's ordering. No network except the loopback fake endpoint started here."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from collect.actions import Action
from collect.ledger import ready
from rewards import REWARD_FUNCS, score_components, total, weights_list
from rewards.judge import JudgeConfig, OfflineJudge, OpenAIJudge, align, build_judge, target, use_judge
from rewards.rules import gate, ledger_of, valid


def cols(row: dict, n: int) -> dict:
    return {k: [v] * n for k, v in row.items() if k != "prompt"}


def ref_text(row: dict) -> str:
    return Action(**json.loads(row["reference_action"])).to_text()


def _finish(answer: str) -> str:
    return Action("finish", {"answer": answer}).to_text()


@pytest.fixture(scope="module")
def st(recorded_states):
    """Three decision states of the session's recorded teacher runs (tests/conftest.py):
    open: an anchor need filled, the dependent web need 1 open; the teacher's reference is web_search for need 1;
    ready: the evidence is closed, the reference is finish with the gold answer;
    conflict: a second source disagreed on a filled value: unresolved conflict, finish gated."""

    def ref(r):
        return json.loads(r["reference_action"])

    def led(r):
        return ledger_of(r["ledger"])

    open_ = next(
        r
        for r in recorded_states
        if ref(r)["name"] == "web_search" and ref(r)["arguments"].get("need_index") == 1 and led(r).needs[0].value
    )
    ready_ = next(r for r in recorded_states if ref(r)["name"] == "finish")
    conflict = next(r for r in recorded_states if led(r).unresolved_conflicts())
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in json.loads(open_["tools"])}
    return SimpleNamespace(
        open=open_,
        ready=ready_,
        conflict=conflict,
        finish=_finish(ready_["gold_answer"]),
        asset=tools["frame_confirm"]["properties"]["asset_id"]["enum"][0],
    )


def test_fixture_states_have_the_readiness_the_tests_assume(st):
    assert not ready(ledger_of(st.open["ledger"]))
    assert ready(ledger_of(st.ready["ledger"])) and st.finish == ref_text(st.ready)  # the teacher's answer is gold
    assert not ready(ledger_of(st.conflict["ledger"])) and ledger_of(st.conflict["ledger"]).unresolved_conflicts()


# ---- valid ---------------------------------------------------------------------------------------------------------


def test_valid_accepts_the_reference_action_as_text_and_as_conversational_message(st):
    c = [ref_text(st.open), [{"role": "assistant", "content": ref_text(st.open)}]]
    assert valid(c, **cols(st.open, 2)) == [1.0, 1.0]


@pytest.mark.parametrize(
    "completion",
    [
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "x"</tool_call>',  # invalid JSON
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "x"}}',  # unterminated block
        "I think we should search the web.",  # no action
        '<tool_call>\n{"name": "google", "arguments": {"query": "x"}}\n</tool_call>',  # unknown tool
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "x", "need_index": "one"}}\n</tool_call>',  # type
        '<tool_call>\n{"name": "web_search", "arguments": {"need_index": 1}}\n</tool_call>',  # missing required
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "x", "why": 1}}\n</tool_call>',  # extra field
        '<tool_call>\n{"name": "finish", "arguments": {"answer": "a"}}\n</tool_call>'
        '<tool_call>\n{"name": "finish", "arguments": {"answer": "b"}}\n</tool_call>',  # two calls
    ],
    ids=["bad_json", "unterminated", "no_action", "unknown_tool", "arg_type", "arg_missing", "arg_extra", "two_calls"],
)
def test_valid_rejects_malformed_unknown_or_schema_violating_actions(st, completion):
    assert valid([completion], **cols(st.open, 1)) == [0.0]


def test_valid_rejects_a_time_range_that_ends_before_it_starts(recorded_states):
    # schema-valid, refused by the tool: the reward must score it as the runtime treats it (a rejected reply)
    def subtitle(r):
        return next(
            (t["function"] for t in json.loads(r["tools"]) if t["function"]["name"] == "subtitle_grounding"), None
        )

    row = next(r for r in recorded_states if subtitle(r) and "time_range" in subtitle(r)["parameters"]["properties"])
    asset = subtitle(row)["parameters"]["properties"]["asset_id"]["enum"][0]
    calls = [
        Action("subtitle_grounding", {"asset_id": asset, "query": "q", "time_range": tr}).to_text()
        for tr in ([30.0, 60.0], [60.0, 30.0])
    ]
    assert valid(calls, **cols(row, 2)) == [1.0, 0.0]


def test_valid_uses_the_rows_own_tool_set(st):
    # frame_confirm exists for the video task but not in a tool set without perception tools
    c = Action("frame_confirm", {"asset_id": st.asset, "query": "q"}).to_text()
    row = dict(st.open)
    assert valid([c], **cols(row, 1)) == [1.0]
    row["tools"] = json.dumps([t for t in json.loads(st.open["tools"]) if t["function"]["name"] != "frame_confirm"])
    assert valid([c], **cols(row, 1)) == [0.0]


# ---- gate ----------------------------------------------------------------------------------------------------------


def test_gate_zero_for_premature_finish_and_one_for_finish_when_ready(st):
    assert gate([st.finish], **cols(st.open, 1)) == [0.0]
    assert gate([st.finish], **cols(st.ready, 1)) == [1.0]


def test_gate_zero_for_finish_with_unresolved_conflict_and_one_for_tool_calls(st):
    assert gate([st.finish], **cols(st.conflict, 1)) == [0.0]
    assert gate([ref_text(st.open), "garbage"], **cols(st.open, 2)) == [1.0, 1.0]


# ---- offline judge -------------------------------------------------------------------------------------------------


def run(coro):
    return asyncio.run(coro)


def test_offline_judge_ranks_reference_above_off_target_actions(st):
    use_judge(OfflineJudge())
    ref = ref_text(st.open)  # web_search for need 1 with the upstream value in the query
    off_need = (
        '<tool_call>\n{"name": "web_search", "arguments": {"query": "anchor name", "need_index": 0}}\n</tool_call>'
    )
    off_tool = Action("audio_scout", {"asset_id": st.asset, "query": "weather", "need_index": 1}).to_text()
    c = [ref, off_need, off_tool, st.finish]
    t = run(target(c, **cols(st.open, 4)))
    a = run(align(c, **cols(st.open, 4)))
    assert a[0] == 1.0 and t[0] > 0.9
    assert t[0] > t[2] > t[1] == 0.0  # need 0 is already filled: targeting it cannot advance anything
    assert a[0] > max(a[1:])
    assert t[3] == a[3] == 0.0  # premature finish
    tot = total({"valid": valid(c, **cols(st.open, 4)), "gate": gate(c, **cols(st.open, 4)), "target": t, "align": a})
    assert tot[0] == pytest.approx(1.0) and tot[0] > max(tot[1:])


def test_a_judge_cache_file_is_read_back_by_the_next_run_instead_of_scoring_again(st, tmp_path):
    row = st.open
    c = [ref_text(row)]
    cache = tmp_path / "judge.jsonl"
    first = use_judge(build_judge({"kind": "offline", "cache_path": str(cache)}))
    scores = run(target(c, **cols(row, 1)))
    again = use_judge(build_judge({"kind": "offline", "cache_path": str(cache)}))
    assert run(target(c, **cols(row, 1))) == scores
    use_judge(OfflineJudge())
    assert (first.stats["scored"], again.stats["scored"], again.stats["cache_hits"]) == (1, 0, 1)
    assert len(cache.read_text().splitlines()) == 1


def test_offline_judge_finish_needs_closed_evidence_and_the_gold_answer(st):
    use_judge(OfflineJudge())
    wrong = _finish("a wrong answer")
    a = run(align([st.finish, wrong], **cols(st.ready, 2)))
    assert a[0] == 1.0 and a[1] < 0.5
    assert run(align([st.finish], **cols(st.conflict, 1))) == [0.0]


def test_reward_table_and_weights_follow_the_paper():
    # the paper's four with its alphas; the execution check (tests/test_rewards_compute.py) weighs 0 unless a recipe
    # turns it on
    assert list(REWARD_FUNCS)[:4] == ["valid", "gate", "target", "align"]
    assert weights_list() == [0.1, 0.1, 0.2, 0.6, 0.0]
    with pytest.raises(ValueError, match="unknown reward weight"):
        weights_list({"format": 1.0})


# ---- LLM judge against a loopback fake endpoint ---------------------------------------------------------------------


class FakeJudgeServer:
    """OpenAI-compatible /chat/completions that answers with a fixed mode and counts requests."""

    def __init__(self, mode: str):
        self.mode = mode
        self.requests = 0
        self.prompts: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                outer.prompts.append(body["messages"][0]["content"])
                if outer.mode == "500":
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "boom"}}')
                    return
                content = {"ok": '{"target": 0.7, "align": 0.4, "reason": "fine"}', "garbage": "no idea, sorry"}
                content["out_of_range"] = '{"target": 3, "align": -1}'
                msg = {"role": "assistant", "content": content[outer.mode]}
                resp = {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "fake",
                    "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                }
                data = json.dumps(resp).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server(request, monkeypatch):
    monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-test")
    srv = FakeJudgeServer(request.param)
    yield srv
    srv.close()
    use_judge(OfflineJudge())


def judge_for(srv: FakeJudgeServer, **kw) -> OpenAIJudge:
    cfg = JudgeConfig(
        kind="openai",
        base_url=srv.url,
        model="fake",
        api_key_env="FAKE_JUDGE_KEY",
        max_retries=1,
        retry_backoff_s=0.0,
        timeout_s=5.0,
        **kw,
    )
    j = build_judge(cfg)
    assert isinstance(j, OpenAIJudge)
    return use_judge(j)


@pytest.mark.parametrize("fake_server", ["500", "garbage", "out_of_range"], indirect=True)
def test_judge_failure_is_skipped_as_none_counted_and_logged_not_zero(st, fake_server):
    judge = judge_for(fake_server)
    logged: dict[str, list[float]] = {}
    kw = cols(st.open, 2) | {"log_metric": lambda k, v: logged.setdefault(k, []).append(v)}
    comps = run(score_components([ref_text(st.open), st.finish], kw))
    assert comps["target"] == [None, None] and comps["align"] == [None, None]
    assert comps["valid"] == [1.0, 1.0] and comps["gate"] == [1.0, 0.0]  # rule dimensions still scored
    assert judge.stats["failures"] == 2  # one per candidate, not one per reward function
    assert fake_server.requests == 2 * 2  # each candidate: first try + 1 retry, shared by target and align
    assert logged["judge/skipped"] == [2.0]
    # the total keeps the rule dimensions and skips the judged ones (no zero punishment)
    assert total(comps) == [pytest.approx(0.2), pytest.approx(0.1)]


@pytest.mark.parametrize("fake_server", ["ok"], indirect=True)
def test_target_and_align_share_one_judge_call_and_repeats_hit_the_cache(st, fake_server):
    judge = judge_for(fake_server)
    c = [ref_text(st.open)] * 3  # G identical samples of one state
    comps = run(score_components(c, cols(st.open, 3)))
    assert comps["target"] == [0.7] * 3 and comps["align"] == [0.4] * 3
    assert fake_server.requests == 1
    run(score_components(c[:1], cols(st.open, 1)))  # a later batch with the same pair
    assert fake_server.requests == 1 and judge.stats["cache_hits"] >= 5
    run(score_components(c[:1], cols(st.ready, 1)))  # same completion, different state: a new request
    assert fake_server.requests == 2
    p = fake_server.prompts[0]
    assert st.open["question"] in p and '"need_index": 1' in p and "{{" not in p


@pytest.mark.parametrize("fake_server", ["ok"], indirect=True)
def test_judge_disk_cache_survives_a_new_judge_instance(st, fake_server, tmp_path):
    path = tmp_path / "judge_cache.jsonl"
    judge_for(fake_server, cache_path=str(path))
    run(target([st.finish], **cols(st.ready, 1)))
    assert fake_server.requests == 1 and path.read_text().count("\n") == 1
    judge2 = judge_for(fake_server, cache_path=str(path))
    assert run(align([st.finish], **cols(st.ready, 1))) == [0.4]
    assert fake_server.requests == 1 and judge2.stats["requests"] == 0


def test_openai_judge_refuses_a_missing_api_key_env(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ValueError, match="NO_SUCH_JUDGE_KEY"):
        build_judge(
            {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "NO_SUCH_JUDGE_KEY"}
        )
