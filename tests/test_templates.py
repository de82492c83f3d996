"""Harvested rows through the real Qwen chat templates (tests/fixtures/chat_templates/) and TRL's own tokenization.

Every row kind (each perception tool, web_search, code_executor with multi-line code, finish, need_parse, and a prompt
that replays an earlier tool call in the OpenAI wire form) is harvested, saved and reloaded (Arrow round trip), then
tokenized by the SFTTrainer that sft.train builds for the GPU recipe, with the tiny tokenizer carrying each real
template. The collated labels must be exactly the template's rendering of the action plus its end of turn.
"""

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
from datasets import load_from_disk

from collect import teacher_runs
from collect.actions import REFERENCE_RULES
from collect.harvest import harvest, template_messages
from sft.tiny import build_tiny_model
from sft.train import build_trainer, parse_args

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"
MULTILINE_CODE = 'rows = {"a": 1, "b": [2, 3]}\nfor k, v in rows.items():\n    print(f"{k} -> {v!r}", "é")\n'
REPLAYED = {"query": "earlier call", "need_index": 0}  # a tool call already in the prompt, arguments as a JSON string


def _trajectories() -> list[dict]:
    """Recorded teacher runs (judged correct) edited so that every tool and the awkward cases occur."""
    trajs = teacher_runs.trajectories(24)
    for t in trajs:
        t["correct"] = True
    seen, edited = set(), False
    for t in trajs:
        for st in t["steps"]:
            a = st["action"]
            if a and a["name"] == "code_executor" and not edited:
                a["arguments"] = {"code": MULTILINE_CODE, "need_index": a["arguments"].get("need_index", 0)}
                # the react arm replays earlier calls: OpenAI wire form, arguments as a JSON string
                st["planner_input"]["messages"] = st["planner_input"]["messages"] + [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "call_0",
                                "type": "function",
                                "function": {"name": "web_search", "arguments": json.dumps(REPLAYED)},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_0", "content": "an observation"},
                    {"role": "user", "content": "continue"},
                ]
                edited = True
            if a:
                seen.add(a["name"])
    assert edited and {"web_search", "code_executor", "finish", "frame_confirm", "audio_scout"} <= seen
    return trajs


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    d = tmp_path_factory.mktemp("templates")
    with open(d / "traj.jsonl", "w") as f:
        for t in _trajectories():
            f.write(json.dumps(t) + "\n")
    harvest(d / "traj.jsonl", d / "data", eval_share=0.0)
    base = build_tiny_model(
        d / "base", texts=list(teacher_runs.texts(24)), hidden_size=64, num_layers=2, intermediate_size=128
    )
    ds = load_from_disk(str(d / "data" / "sft"))["train"]
    # one row per kind/tool (+ the replayed-call row), in dataset order
    picked, keys = [], set()
    for i, r in enumerate(ds):
        call = (r["completion"][0].get("tool_calls") or [{}])[0].get("function", {})
        key = (r["kind"], call.get("name"), len(r["prompt"]) > 2)
        if key not in keys:
            keys.add(key)
            picked.append(i)
    return d, base, ds, picked


def test_harvest_rows_carry_mapping_arguments_with_only_their_own_keys(env):
    d, _, ds, picked = env
    names = set()
    for r in ds:
        if r["kind"] != "decision":
            continue
        f = r["completion"][0]["tool_calls"][0]["function"]
        names.add(f["name"])
        assert isinstance(f["arguments"], dict) and None not in f["arguments"].values()
    assert {"web_search", "code_executor", "finish", "frame_confirm", "audio_scout", "subtitle_grounding"} <= names
    calls = [r["completion"][0]["tool_calls"][0]["function"] for r in ds if r["kind"] == "decision"]
    assert any(f["arguments"].get("code") == MULTILINE_CODE for f in calls)
    replayed = [m for r in ds for m in r["prompt"] if m.get("tool_calls")]
    assert replayed and replayed[0]["tool_calls"][0]["function"]["arguments"] == REPLAYED  # decoded like vLLM does


def test_template_messages_decodes_wire_arguments_and_keeps_the_rest():
    wire = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    assert template_messages(wire)[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert wire[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # input untouched
    bad = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    # as vLLM does (tests/test_tool_call_symmetry.py has its recorded cases): not a JSON object -> {}
    assert template_messages(bad)[0]["tool_calls"][0]["function"]["arguments"] == {}
    assert bad[0]["tool_calls"][0]["function"]["arguments"] == "{oops"  # input untouched
    plain = [{"role": "user", "content": "x"}]
    assert template_messages(plain) == plain


def test_the_qwen3_5_fixture_is_the_template_that_rejects_string_arguments(env):
    """Why the rows changed: Qwen3.5's template iterates `arguments|items` (the crash seen in issue 14)."""
    from transformers import AutoTokenizer

    _, base, ds, _ = env
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = (TEMPLATES / "qwen3_5_think.jinja").read_text()
    row = next(r for r in ds if r["kind"] == "decision")
    wire = copy.deepcopy(row["completion"])
    wire[0]["tool_calls"][0]["function"]["arguments"] = json.dumps(wire[0]["tool_calls"][0]["function"]["arguments"])
    with pytest.raises(TypeError, match="mapping"):
        tok.apply_chat_template(row["prompt"] + wire, tools=json.loads(row["tools"]), tokenize=False)
    tok.apply_chat_template(row["prompt"] + row["completion"], tools=json.loads(row["tools"]), tokenize=False)


def test_the_qwen3_omni_fixture_is_the_omni_template(env):
    """What tells the Omni template from Qwen3's: list content items render as the Omni media placeholders, and a
    user turn with list content is not a "query", so the next assistant turn gets no <think> block (the quirk
    reported for the Qwen3-Omni template in sujitnoronha/audio_reasoning_interspeech, its THINKING_TAGS_BUG.md)."""
    from transformers import AutoTokenizer

    _, base, _, _ = env
    tok = AutoTokenizer.from_pretrained(base)
    omni = (TEMPLATES / "qwen3_omni.jinja").read_text()
    media = [
        {"type": "audio", "audio": "a.wav"},
        {"type": "image", "image": "i.png"},
        {"type": "video", "video": "v.mp4"},
    ]
    call = {"type": "function", "function": {"name": "web_search", "arguments": {"query": "ferry"}}}
    messages = [
        {"role": "user", "content": [*media, {"type": "text", "text": "which company?"}]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    assert tok.apply_chat_template(messages, tokenize=False, chat_template=omni) == (
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|><|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|>which company?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "web_search", "arguments": {"query": "ferry"}}\n</tool_call>'
        "<|im_end|>\n"
    )
    messages[0]["content"] = "which company?"  # a string query: the last assistant turn gets its (empty) think block
    rendered = tok.apply_chat_template(messages, tokenize=False, chat_template=omni)
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n" in rendered


def _hermes(name: str, args: dict) -> str:  # Qwen2.5 / Qwen3: the JSON object form (= collect.actions.Action.to_text)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def _xml(name: str, args: dict) -> str:  # Qwen3.5: one <parameter=...> block per argument
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
        for k, v in args.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


# case -> (template fixture, recipe it is trained with, rendering of a call, end of the assistant turn, extra args)
OMNI = ("--model_class", "causal_lm")  # the tiny base is a plain causal LM; the tokenization does not depend on it
CASES = {
    "qwen2_5": ("qwen2_5.jinja", "configs/sft/qwen3_5_27b.yaml", _hermes, "<|im_end|>\n", ()),
    "qwen3": ("qwen3.jinja", "configs/sft/qwen3_5_27b.yaml", _hermes, "<|im_end|>\n", ()),
    "qwen3_5_think": ("qwen3_5_think.jinja", "configs/sft/qwen3_5_27b.yaml", _xml, "<|im_end|>\n", ()),
    "qwen3_5_nothink": ("qwen3_5_nothink.jinja", "configs/sft/qwen3_5_27b.yaml", _xml, "<|im_end|>\n", ()),
    # Qwen3-Omni renders the last assistant turn after the last user query with a <think> block, empty when the row
    # has no reasoning: the recipe as written (enable_thinking=false) must keep that block in the prompt, not labels
    "qwen3_omni": ("qwen3_omni.jinja", "configs/sft/qwen3_omni_30b.yaml", _hermes, "<|im_end|>\n", OMNI),
    "tiny": (None, "configs/sft/tiny.yaml", _hermes, "<|im_end|>", ()),  # {% generation %} ends before the newline
}


def _sft_trainer(env, case: str, tmp_path: Path, data: Path | None = None, more: tuple = ()):
    """(trainer, dataset, parsed args) of the SFTTrainer sft.train builds for CASES[case]'s recipe, on the harvested
    decision and need-parse rows (env's, or those under `data`), with the tiny tokenizer carrying the case's real
    template."""
    d, base, _, _ = env
    data = data or d / "data"
    template, recipe, _, _, extra = CASES[case]
    model_dir = tmp_path / "model"
    shutil.copytree(base, model_dir)
    if template is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        tok.chat_template = (TEMPLATES / template).read_text()
        tok.save_pretrained(model_dir)
    args = parse_args(
        [
            "--config", str(ROOT / recipe), "--model_name_or_path", str(model_dir),
            "--dataset_dir", str(data / "sft"), "--output_dir", str(tmp_path / "out"),
            "--bf16", "false", "--dtype", "float32", "--gradient_checkpointing", "false", "--eval_strategy", "no",
            "--kinds", "decision,need_parse", *extra, *more,
        ]
    )  # fmt: skip
    trainer, dataset = build_trainer(*args)
    return trainer, dataset, args


@pytest.mark.parametrize("case", sorted(CASES))
def test_trl_prepares_the_same_rows_with_and_without_the_segment_cache(env, case, tmp_path):
    """sft.train encodes through sft/segment_cache.py while TRL prepares the rows (each chat turn encoded once): under
    each real template and its recipe's loss settings, TRL's tokenized dataset must be the one it makes by itself."""
    cached, _, _ = _sft_trainer(env, case, tmp_path / "cached")
    plain, _, _ = _sft_trainer(env, case, tmp_path / "plain", more=("--segment_cache", "false"))
    assert plain.segment_cache_stats is None
    stats = cached.segment_cache_stats
    n = len(cached.train_dataset)  # TRL encodes each row's prompt and prompt + completion (+ 1 check with the
    assert stats["enabled"] and 2 * n <= stats["texts"] <= 2 * n + 1 and stats["delegated"] == 0, stats  # tiny's)
    assert stats["piece_hits"] > stats["pieces"] / 2, stats  # the role prompt and tool schemas were reused
    a, b = cached.train_dataset, plain.train_dataset
    assert a.column_names == b.column_names and len(a) == len(b) > 0
    assert a.to_dict() == b.to_dict()
    assert any(x != -100 for x in a[0]["labels"]) and any(x == -100 for x in a[0]["labels"])


def _decision_states(env, case: str, tmp_path: Path):
    """The case's SFT trainer and tokenizer, the recipe's chat_template_kwargs, the picked SFT rows that are decisions,
    and their recorded states (rl_states rows of the same (task_id, step), in the same order)."""
    d, _, ds, picked = env
    trainer, _, args = _sft_trainer(env, case, tmp_path)
    kwargs = json.loads(args[0].chat_template_kwargs or "{}")
    rl = load_from_disk(str(d / "data" / "rl_states"))["train"]
    by_state = {(r["task_id"], r["step"]): i for i, r in enumerate(rl)}
    rows = [i for i in picked if ds[i]["kind"] == "decision"]
    states = rl.select([by_state[(ds[i]["task_id"], ds[i]["step"])] for i in rows])
    return trainer, trainer.processing_class, kwargs, rows, states


@pytest.mark.parametrize("case", sorted(CASES))
def test_trl_labels_are_exactly_the_rendered_action_for_every_row_kind(env, case, tmp_path):
    _, _, ds, picked = env
    _, _, render_call, end, _ = CASES[case]
    trainer, dataset, _ = _sft_trainer(env, case, tmp_path)
    tok = trainer.processing_class
    batch = trainer.data_collator([trainer.train_dataset[i] for i in picked])
    kinds = set()
    for j, i in enumerate(picked):
        row = dataset["train"][i]
        msg = row["completion"][0]
        if msg.get("tool_calls"):
            f = msg["tool_calls"][0]["function"]
            expected = render_call(f["name"], f["arguments"]) + end
            kinds.add(f["name"])
        else:
            expected = msg["content"] + end
            kinds.add("need_parse")
        ids, labels = batch["input_ids"][j], batch["labels"][j]
        assert tok.decode(ids[labels != -100]) == expected, (case, i)
        labelled = (labels != -100).nonzero().flatten()
        first = int(labelled[0])
        assert labelled.tolist() == list(range(first, first + len(labelled)))  # one run: nothing of the prompt
        prompt = tok.decode(ids[:first])
        assert prompt.rstrip("\n").endswith(("<|im_start|>assistant", "</think>")), prompt[-60:]
    assert {"web_search", "code_executor", "finish", "frame_confirm", "audio_scout", "need_parse"} <= kinds


@pytest.mark.parametrize("case", sorted(CASES))
def test_grpo_prompt_is_exactly_the_sft_prompt_of_the_same_state(env, case, tmp_path):
    """rl.train's pre-rendered GRPO prompt of a recorded state must be the text state-SFT trained that state's action
    after (everything before TRL's first label), under each real template and the recipe's chat_template_kwargs,
    including the row whose prompt replays a wire-form call (Qwen3.5's template rejects its string arguments)."""
    from rl.train import render_prompts

    trainer, tok, kwargs, rows, states = _decision_states(env, case, tmp_path)
    assert any(len(p) > 2 for p in states["prompt"])  # the replayed wire-form call is among them
    rendered = render_prompts(states, tok, kwargs)["prompt"]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in rows])
    for j, i in enumerate(rows):
        ids, labels = batch["input_ids"][j], batch["labels"][j]
        first = int((labels != -100).nonzero().flatten()[0])
        assert tok(rendered[j], add_special_tokens=False)["input_ids"] == ids[:first].tolist(), (case, i)


@pytest.fixture(scope="module")
def window_data(tmp_path_factory):
    """Teacher runs offering need and window references (configs/collect/embedded_1800.yaml), harvested as
    `make collect` does: decision rows whose time_range is the string "{window:K}" beside rows without one, in one
    Arrow dataset."""
    from tests.helpers.teacher_collect import collect_refs

    d = tmp_path_factory.mktemp("template-windows")
    _, out = collect_refs(d / "collect", 30, ("need", "window"))
    harvest(out / "trajectories.jsonl", d / "data", eval_share=0.0)
    return d / "data"


@pytest.mark.parametrize("case", sorted(CASES))
def test_trl_labels_of_window_reference_rows_are_the_rendered_reference(env, window_data, case, tmp_path):
    """A window-reference call survives the Arrow round trip as the string the teacher wrote (not coerced to the
    list type other rows give time_range) and each real template renders it as that string, in the labels only."""
    _, _, render_call, end, _ = CASES[case]
    trainer, dataset, _ = _sft_trainer(env, case, tmp_path, window_data)
    rows = dataset["train"]
    refs, lists = [], 0
    for i, r in enumerate(rows):
        calls = r["completion"][0].get("tool_calls") or []
        tr = calls[0]["function"]["arguments"].get("time_range") if calls else None
        if isinstance(tr, str):
            refs.append(i)
        lists += isinstance(tr, list)
    assert len(refs) >= 5 and lists == 0  # the teacher names every window it can by its need
    tok = trainer.processing_class
    batch = trainer.data_collator([trainer.train_dataset[i] for i in refs])
    for j, i in enumerate(refs):
        f = rows[i]["completion"][0]["tool_calls"][0]["function"]
        assert re.fullmatch(r"\{window:\d+\}", f["arguments"]["time_range"]), f
        ids, labels = batch["input_ids"][j], batch["labels"][j]
        label = tok.decode(ids[labels != -100])
        assert label == render_call(f["name"], f["arguments"]) + end, (case, i)
        assert f["arguments"]["time_range"] in label
        first = int((labels != -100).nonzero().flatten()[0])
        prompt = tok.decode(ids[:first])
        assert REFERENCE_RULES["window"].strip() in prompt  # the rule that offers references is in the system prompt
