"""sft.tiny: the offline tiny Qwen3 planner model and its tool-calling chat template."""

import json

import pytest
from safetensors.torch import load_file

from collect import teacher_runs
from collect.actions import Action
from sft.tiny import build_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def step(recorded_correct_runs):
    """The first planner step of the first recorded teacher run."""
    return recorded_correct_runs[0]["steps"][0]


def _with_action(step):
    a = step["action"]
    call = {"type": "function", "function": {"name": a["name"], "arguments": json.dumps(a["arguments"])}}
    return step["planner_input"]["messages"] + [{"role": "assistant", "content": "", "tool_calls": [call]}]


def test_builds_in_seconds_and_reloads_offline_as_causal_lm(tiny_model_build, tok, step):
    import torch
    from transformers import AutoModelForCausalLM

    path, seconds = tiny_model_build
    assert seconds < 30, f"tiny build took {seconds:.1f}s"
    model = AutoModelForCausalLM.from_pretrained(path)  # HF_HUB_OFFLINE=1 is set by sft.train / serve.local imports
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) < 3_000_000
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    enc = tok.apply_chat_template(
        step["planner_input"]["messages"], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > enc["input_ids"].shape[1]
    assert torch.isfinite(model(**enc).logits).all()


def test_same_seed_gives_identical_weights_and_tokenizer(tmp_path):
    texts = list(teacher_runs.texts(n=12))
    a = build_tiny_model(tmp_path / "a", texts=texts, seed=7)
    b = build_tiny_model(tmp_path / "b", texts=texts, seed=7)
    c = build_tiny_model(tmp_path / "c", texts=texts, seed=8)
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert wa.keys() == wb.keys()
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any((wa[k] != wc[k]).any() for k in wa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_assistant_mask_covers_exactly_the_canonical_action_and_stop_token(tok, step):
    st = step
    out = tok.apply_chat_template(
        _with_action(st),
        tools=st["planner_input"]["tools"],
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    expected = Action(st["action"]["name"], st["action"]["arguments"]).to_text() + "<|im_end|>"
    assert tok.decode(masked) == expected
    # the masked tokens are one contiguous run at the end (before the template's trailing newline)
    idx = [k for k, m in enumerate(out["assistant_masks"]) if m]
    assert idx == list(range(idx[0], idx[0] + len(idx))) and idx[-1] >= len(out["input_ids"]) - 2


def test_template_renders_tools_and_passes_trl_template_checks(tok, step):
    from trl.chat_template_utils import has_generation_markers, is_chat_template_prefix_preserving

    st = step
    text = tok.apply_chat_template(
        st["planner_input"]["messages"], tools=st["planner_input"]["tools"], add_generation_prompt=True, tokenize=False
    )
    for t in st["planner_input"]["tools"]:
        assert json.dumps(t, ensure_ascii=False) in text
    assert text.endswith("<|im_start|>assistant\n")
    assert has_generation_markers(tok.chat_template)
    assert is_chat_template_prefix_preserving(tok)


def test_tool_tags_are_single_non_special_tokens(tok):
    ids = tok.encode("<tool_call>", add_special_tokens=False)
    assert len(ids) == 1
    assert tok.decode(tok.encode("<tool_call>x</tool_call><|im_end|>"), skip_special_tokens=True) == (
        "<tool_call>x</tool_call>"
    )


def test_ledger_prompts_are_compact(tok, recorded_correct_runs):
    run = next(r for r in recorded_correct_runs if r["task_meta"]["family"] == "anchor_compute")
    st = run["steps"][-2]  # a late step of a long task: the program-writing decision
    text = tok.apply_chat_template(_with_action(st), tools=st["planner_input"]["tools"], tokenize=False)
    n = len(tok.encode(text, add_special_tokens=False))
    assert len(text) / n > 4.0, f"{len(text)} chars -> {n} tokens"


def test_decision_budgets_cover_the_teachers_longest_action(tok, monkeypatch):
    """A planner cut off mid-call emits an invalid action: the tiny RL recipe (generation length, also rl.score's
    default), the eval planner max_tokens and serve.local's default must fit the longest call the teacher makes, a
    code_executor program (compute helpers + values), an order of magnitude longer than any other action."""
    from pathlib import Path

    from collect.compute import program
    from pipeline.eval import EvalConfig, load_eval_config
    from rl.train import load_config
    from serve.local import DEFAULT_MAX_TOKENS

    root = Path(__file__).resolve().parents[1]
    code = "# second attempt\n" + program(
        "days_between(v1, v2) * to_num(v3)", {1: "14 September 2019", 2: "28 February 2023", 3: "1,234.75 tessels"}
    )
    action = Action("code_executor", {"code": code, "need_index": 12}).to_text() + "<|im_end|>"
    n = len(tok(action)["input_ids"])
    assert n > 300  # really the long case
    monkeypatch.chdir(root)
    budgets = {
        "configs/rl/tiny.yaml max_completion_length": load_config("configs/rl/tiny.yaml")[1].max_completion_length,
        "configs/eval/demo.yaml planner max_tokens": load_eval_config("configs/eval/demo.yaml").planner_endpoint[
            "max_tokens"
        ],
        "eval default planner max_tokens": EvalConfig().planner_endpoint["max_tokens"],
        "serve.local default max_tokens": DEFAULT_MAX_TOKENS,
    }
    for where, budget in budgets.items():
        assert budget >= n + 16, f"{where} = {budget} < {n} tokens of the longest teacher action"
