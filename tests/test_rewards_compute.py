"""The execution check (rewards.execution.compute) on recorded teacher states: the reference program of a compute
need, rewritten programs that print the same value or another one, hostile programs, value references, a sandbox
that fails, and the recipe plumbing (weights, a zero weight runs nothing). Programs run in the real sandbox."""

from __future__ import annotations

import asyncio
import json

import pytest

import rewards.execution
from collect.actions import REFERENCE_RULES, Action, write_value_refs
from rewards import REWARD_FUNCS, score_components, total, trainer_reward_funcs, weights_list
from rewards.execution import ExecutionCheck, compute, use_execution_check
from rewards.judge import OfflineJudge, align, use_judge
from rewards.rules import ledger_of
from rl.train import named_weights


def cols(row: dict, n: int) -> dict:
    return {k: [v] * n for k, v in row.items() if k != "prompt"}


def ref(row: dict) -> dict:
    return json.loads(row["reference_action"])


def code_call(row: dict, code: str) -> str:
    return Action("code_executor", {"code": code, "need_index": ref(row)["arguments"]["need_index"]}).to_text()


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def check():
    """A fresh memo per test (the process-wide one would carry outputs across tests)."""
    old = use_execution_check(ExecutionCheck(timeout_s=3.0))
    use_judge(OfflineJudge())
    yield use_execution_check(ExecutionCheck(timeout_s=3.0))
    use_execution_check(old)


@pytest.fixture(scope="module")
def code_state(recorded_states):
    """A recorded teacher state whose reference decision is a program: a difference of two years
    (`print(fmt(to_num(v2) - to_num(v1)))`, the anchor_compute family), and its program split at the last line."""
    row = next(
        r for r in recorded_states if ref(r)["name"] == "code_executor" and "to_num(v2) - to_num(v1)" in _code(r)
    )
    head, last = _code(row).rstrip("\n").rsplit("\n", 1)
    assert last == "print(fmt(to_num(v2) - to_num(v1)))"
    return row, head


def _code(row: dict) -> str:
    return ref(row)["arguments"]["code"]


def test_the_reference_program_scores_one_and_another_formula_zero_where_align_barely_differs(code_state, check):
    row, head = code_state
    right = code_call(row, _code(row))
    rewritten = code_call(row, head + "\nd = to_num(v2) - to_num(v1)\nprint(fmt(d))  # same value\n")
    wrong = code_call(row, head + "\nprint(fmt(to_num(v2) + to_num(v1)))\n")  # computes another thing
    assert run(compute([right, rewritten, wrong], **cols(row, 3))) == [1.0, 1.0, 0.0]
    # the judged align cannot tell them apart: ~0.9 for every program on the reference's need
    a = run(align([rewritten, wrong], **cols(row, 2)))
    assert a[0] == a[1] and a[1] > 0.85
    assert check.stats["runs"] == 3  # the reference ran once for three candidates


def test_a_call_that_is_not_a_working_program_scores_zero(code_state, check):
    row, head = code_state
    search = Action("web_search", {"query": "year founded", "need_index": 2}).to_text()
    candidates = [
        search,  # the right need, not a program
        code_call(row, head + "\nprint(fmt(to_num(v3)))\n"),  # NameError
        code_call(row, head + "\nwhile True:\n    pass\n"),  # killed at the time limit
        code_call(row, head + "\nimport os\nos._exit(0)\n"),  # exits 0 and prints nothing
        "no call at all",
        '<tool_call>\n{"name": "code_executor", "arguments": {"code": 3}}\n</tool_call>',  # schema violation
    ]
    assert run(compute(candidates, **cols(row, len(candidates)))) == [0.0] * len(candidates)


def test_the_check_does_not_apply_where_the_reference_is_not_a_program(recorded_states, check):
    row = next(r for r in recorded_states if ref(r)["name"] == "web_search")
    program = code_call(row, "print(1)")
    assert run(compute([program, "garbage"], **cols(row, 2))) == [None, None]
    assert check.stats["runs"] == 0
    # and in the weighted total it is left out, as a skipped judge call
    comps = run(score_components([program], cols(row, 1)))
    assert comps["compute"] == [None]
    assert total(comps, {"compute": 5.0}) == total(comps)


def test_a_program_written_with_value_references_is_resolved_as_the_runtime_resolves_it(code_state, check):
    row, _ = code_state
    values = ledger_of(row["ledger"]).filled_values()
    refd = write_value_refs(Action("code_executor", ref(row)["arguments"]), values)
    assert "{need:" in refd.arguments["code"] and refd != Action("code_executor", ref(row)["arguments"])
    c = cols(row, 1)
    offered = {**c, "prompts": [f"<|im_start|>system\n{REFERENCE_RULES['need']}<|im_end|>"]}
    assert run(compute([refd.to_text()], **offered)) == [1.0]
    # where the prompt does not offer references, "{need:K}" is literal text: Python refuses it
    assert run(compute([refd.to_text()], **c)) == [0.0]
    # a reference to a need with no value is a malformed call
    bad = refd.arguments["code"].replace("{need:", "{need:9", 1)
    assert run(compute([code_call(row, bad)], **offered)) == [0.0]


def test_a_sandbox_that_cannot_run_is_a_skip_counted_not_a_zero(code_state, check, monkeypatch, caplog):
    import collect.tools.code_executor as ce

    async def broken(code, **kw):
        raise ce.SandboxSetupError("no namespaces here")

    monkeypatch.setattr(rewards.execution, "run_code_async", broken)
    row, _ = code_state
    assert run(compute([code_call(row, _code(row))], **cols(row, 1))) == [None]
    assert check.stats["sandbox_errors"] == 1 and "compute reward skipped" in caplog.text
    assert check.outputs == {}  # a failure is not remembered as the program's output


def test_weights_name_the_fifth_reward_and_a_zero_weight_runs_no_program(code_state, check, monkeypatch):
    assert list(REWARD_FUNCS) == ["valid", "gate", "target", "align", "compute"]
    assert weights_list() == [0.1, 0.1, 0.2, 0.6, 0.0]  # the paper's reward unless a recipe weighs compute
    assert named_weights([0.25] * 4) == {"valid": 0.25, "gate": 0.25, "target": 0.25, "align": 0.25, "compute": 0.0}
    assert named_weights([0.1, 0.1, 0.2, 0.3, 0.3])["compute"] == 0.3
    with pytest.raises(ValueError, match="3 values for 5 rewards"):
        named_weights([1.0, 1.0, 1.0])

    row, _ = code_state
    calls = []
    import collect.tools.code_executor as ce

    real = ce.run_code_async

    async def counting(code, **kw):
        calls.append(code)
        return await real(code, **kw)

    monkeypatch.setattr(rewards.execution, "run_code_async", counting)
    off = trainer_reward_funcs(named_weights(None))[-1]
    assert off.__name__ == "compute" and off is not compute
    assert off([code_call(row, _code(row))], **cols(row, 1)) == [None] and calls == []
    on = trainer_reward_funcs({"compute": 0.5})[-1]
    assert on is compute and run(on([code_call(row, _code(row))], **cols(row, 1))) == [1.0] and len(calls) == 1
