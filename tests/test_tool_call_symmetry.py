"""Train/serve symmetry of tool calls, on CPU: what state-SFT trains is what the served planner sees and says.

Two sides, for each family's real chat template (tests/fixtures/chat_templates/) and serve recipe (configs/serve/):
- the reply: the assistant text SFT trains on (TRL's labels for every row kind, up to the end-of-sequence token where
  generation stops) goes through the tool-call parser of the `vllm serve` command serve/vllm.py builds and comes back
  as the same call with the same arguments (need-parse rows: as the same content, no call);
- the prompt: vLLM's rendering of the recorded request (the planner's messages and tools as sent, tool-call
  arguments decoded as vLLM does, the command's --default-chat-template-kwargs and --chat-template-content-format)
  equals the SFT prompt token for token.
vLLM is not installed on CPU: tests/helpers/vllm_chat.py re-implements its parsers and its request rendering, and the
first tests here check that re-implementation against vLLM's own outputs recorded in
tests/fixtures/vllm_tool_parsers.json (vLLM 0.31.0, the version constraints/gpu.txt pins). The last tests are the
negative checks: a wrong parser, an enable_thinking that differs between SFT and serving, and vLLM's auto-detected
content format each break the symmetry, and the checks here say so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from constraints.gpu_resolution import read_pins
from serve.vllm import VLLMServeConfig, build_vllm_command
from tests.helpers import vllm_chat as V
from tests.test_templates import TEMPLATES, _sft_trainer, env, window_data  # noqa: F401 (env, window_data: fixtures)

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((ROOT / "tests/fixtures/vllm_tool_parsers.json").read_text())
# template case (tests/test_templates.py CASES) -> (serve.vllm family, serve recipe). No recipe serves Qwen2.5/Qwen3
# here: the Qwen3.5 recipe with their family stands in, as the Qwen3.5 SFT recipe does on their SFT side.
FAMILIES = {
    "qwen2_5": ("qwen2.5", "qwen3_5_27b_merged"),
    "qwen3": ("qwen3", "qwen3_5_27b_merged"),
    "qwen3_5_think": ("qwen3.5", "qwen3_5_27b_merged"),
    "qwen3_5_nothink": ("qwen3.5", "qwen3_5_27b_lora"),
    "qwen3_omni": ("qwen3-omni", "qwen3_omni_30b_merged"),
}
OTHER_PARSER = {"hermes": "qwen3_coder", "qwen3_coder": "hermes"}


# ---- the re-implementation against vLLM's own outputs ---------------------------------------------------------------


def test_fixture_is_from_the_vllm_the_gpu_stack_pins():
    assert FIXTURE["vllm"]["version"] == read_pins(ROOT / "constraints/gpu.txt")["vllm"]
    assert re.fullmatch(r"[0-9a-f]{40}", FIXTURE["vllm"]["commit"])


@pytest.mark.parametrize("case", FIXTURE["parser_cases"], ids=lambda c: f"{c['parser']}-{c['case']}")
def test_parser_reimplementation_returns_what_vllm_returned(case):
    got = V.PARSERS[case["parser"]](case["text"], FIXTURE["tools"])
    assert got.calls == [(c["name"], c["arguments"]) for c in case["calls"]]
    assert got.content == case["content"]


@pytest.mark.parametrize("name", sorted(FIXTURE["render"]["detected_content_format"]))
def test_content_format_detection_is_vllms(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    assert V.content_format(template) == FIXTURE["render"]["detected_content_format"][name]


@pytest.fixture(scope="module")
def tokenizer():
    """The tokenizer vLLM rendered the fixture's prompts with (rendering to text does not depend on it)."""
    from sft.tiny import default_texts, train_tokenizer

    return train_tokenizer(default_texts(0))


@pytest.mark.parametrize(
    "case",
    FIXTURE["render"]["cases"],
    ids=lambda c: f"{c['template']}-{c['content_format']}-{json.dumps(c['default_chat_template_kwargs'])}",
)
def test_request_rendering_reimplementation_renders_what_vllm_rendered(case, tokenizer):
    request = FIXTURE["render"]["request"]
    template = (TEMPLATES / f"{case['template']}.jinja").read_text()
    kwargs = case["default_chat_template_kwargs"]

    def render():
        messages, tools = request["messages"], request["tools"]
        return V.serving_prompt(tokenizer, template, messages, tools, kwargs, case["content_format"])

    if "error" in case:  # vLLM answered 400 with the template's error
        with pytest.raises(Exception) as e:
            render()
        assert str(e.value) == case["error"]
    else:
        assert render() == case["prompt"]


@pytest.mark.parametrize(
    "case", FIXTURE["postprocess_cases"], ids=lambda c: json.dumps(c["messages"][1]["tool_calls"])
)
def test_tool_call_arguments_reach_the_template_as_vllm_passes_them(case):
    """vLLM decodes a JSON-object `arguments` string to a mapping and makes every other value (empty, None, malformed,
    not an object) {}; an empty tool_calls list is dropped. The re-implementation and the SFT/GRPO side
    (collect.harvest.template_messages, which sft.train and rl.train render through) must do the same."""
    from collect.harvest import template_messages

    want = case["conversation"][1]
    for got in (V.serving_messages(case["messages"], "string")[1], template_messages(case["messages"])[1]):
        assert ("tool_calls" in got) == ("tool_calls" in want)
        assert got.get("tool_calls") == want.get("tool_calls")


def test_serving_tools_carry_a_null_description_when_the_request_has_none():
    """A tool without `description` reaches the template as `"description": null` (ChatCompletionToolsParam's dump):
    the serving prompt then differs from SFT's, which renders the tool as written. Every tool schema the runtime
    sends has all three keys (the symmetry tests below would fail otherwise)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    assert V.serving_tools([tool]) == [
        {"type": "function", "function": {"name": "f", "description": None, "parameters": {"type": "object"}}}
    ]


# ---- the serve command ----------------------------------------------------------------------------------------------


def serve_options(case: str, **override) -> dict:
    """Parser, default template kwargs and content format of the `vllm serve` command for the case's family."""
    family, recipe = FAMILIES[case]
    cfg = VLLMServeConfig.from_yaml(ROOT / f"configs/serve/{recipe}.yaml")
    cfg.family = family
    for k, v in override.items():
        setattr(cfg, k, v)
    return V.serve_options(build_vllm_command(cfg))


def test_each_family_is_served_with_the_parser_of_its_templates_form():
    """The pick, from the parser cases: a hermes JSON block is a call only for `hermes`, the XML block only for
    `qwen3_coder` (and `qwen3_xml`, the same class in vLLM 0.31); Qwen2.5/Qwen3/Qwen3-Omni templates write the
    first, Qwen3.5's the second (the symmetry tests below parse every row kind back)."""
    by = {(c["parser"], c["case"]): bool(c["calls"]) for c in FIXTURE["parser_cases"]}
    assert by["hermes", "hermes_one_call"] and not by["hermes", "xml_one_call"]
    assert by["qwen3_coder", "xml_one_call"] and not by["qwen3_coder", "hermes_one_call"]
    picked = {case: serve_options(case)["tool_call_parser"] for case in FAMILIES}
    assert picked == {
        "qwen2_5": "hermes",
        "qwen3": "hermes",
        "qwen3_5_think": "qwen3_coder",
        "qwen3_5_nothink": "qwen3_coder",
        "qwen3_omni": "hermes",
    }
    assert {serve_options(case)["content_format"] for case in FAMILIES} == {"string"}


# ---- the two sides on harvested rows --------------------------------------------------------------------------------


def _same(a, b) -> bool:
    """Equal JSON values: numbers compare by value (vLLM may turn 12.0 into 12), never a bool for a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


class Built:
    """sft.train's SFTTrainer for a case's template and recipe on harvested rows (built once per case and data)."""

    def __init__(self, harvested, tmp_path_factory):
        self.env, self.tmp, self.cache = harvested, tmp_path_factory, {}

    def get(self, case: str, data: Path | None = None):
        """(trainer, the harvested SFT rows in the trainer's order, the harvest's directory)."""
        from datasets import load_from_disk

        key = (case, data)
        if key not in self.cache:
            trainer, dataset, _ = _sft_trainer(self.env, case, self.tmp.mktemp(case), data)
            data_dir = data or self.env[0] / "data"
            rows = load_from_disk(str(data_dir / "sft"))["train"]
            assert len(rows) == len(trainer.train_dataset) == len(dataset["train"])
            assert [r["completion"] for r in rows] == dataset["train"]["completion"]  # the same rows, same order
            self.cache[key] = (trainer, rows, data_dir)
        return self.cache[key]


@pytest.fixture(scope="module")
def built(env, tmp_path_factory):  # noqa: F811 (env is the imported fixture)
    return Built(env, tmp_path_factory)


def _rows(built: Built, case: str, data: Path | None = None, refs_only: bool = False) -> list[int]:
    """Rows to check: the env's picked rows (one per kind/tool + the replayed call), or every window-reference row."""
    if not refs_only:
        return built.env[3]
    _, rows, _ = built.get(case, data)
    out = []
    for i, r in enumerate(rows):
        calls = r["completion"][0].get("tool_calls") or []
        if calls and isinstance(calls[0]["function"]["arguments"].get("time_range"), str):
            out.append(i)
    assert len(out) >= 5
    return out


def _labelled(trainer, idx: list[int]):
    batch = trainer.data_collator([trainer.train_dataset[i] for i in idx])
    for j in range(len(idx)):
        ids, labels = batch["input_ids"][j], batch["labels"][j]
        first = int((labels != -100).nonzero().flatten()[0])
        yield ids[:first].tolist(), ids[labels != -100].tolist()


def reply_mismatches(built: Built, case: str, parser: str, data=None, refs_only=False) -> list[tuple]:
    """Rows whose trained assistant text does not come back through `parser` as their call (or their content)."""
    trainer, rows, _ = built.get(case, data)
    tok = trainer.processing_class
    idx = _rows(built, case, data, refs_only)
    bad = []
    for i, (_, label) in zip(idx, _labelled(trainer, idx), strict=True):
        text = tok.decode(label[: label.index(tok.eos_token_id)])  # generation stops at the end-of-sequence token
        row = rows[i]
        got = V.PARSERS[parser](text, json.loads(row["tools"]) or None)
        msg = row["completion"][0]
        if msg.get("tool_calls"):
            f = msg["tool_calls"][0]["function"]
            ok = (
                len(got.calls) == 1
                and got.calls[0][0] == f["name"]
                and _same(json.loads(got.calls[0][1]), f["arguments"])
                and got.content is None
            )
        else:
            ok = got.calls == [] and got.content == msg["content"]
        if not ok:
            bad.append((row["kind"], row["task_id"], row["step"], text, got))
    return bad


def _requests(data: Path) -> dict:
    """(task_id, step) -> the recorded request (messages as sent, tools): decision states from rl_states.*.jsonl (the
    wire form), need-parse requests from the SFT rows (no tool calls to decode; sent without tools)."""
    out = {}
    for line in (data / "rl_states.train.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["task_id"], r["step"]] = (r["prompt"], json.loads(r["tools"]))
    for line in (data / "sft.train.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "need_parse":
            out[r["task_id"], r["step"]] = (r["prompt"], None)
    return out


def prompt_mismatches(built: Built, case: str, opts: dict, data=None, refs_only=False) -> list[tuple]:
    """Rows whose served prompt (vLLM's rendering of the recorded request under `opts`) is not the SFT prompt."""
    trainer, rows, data_dir = built.get(case, data)
    tok = trainer.processing_class
    template = (TEMPLATES / f"{case}.jinja").read_text()
    fmt = opts["content_format"] if opts["content_format"] != "auto" else V.content_format(template)
    requests = _requests(data_dir)
    idx = _rows(built, case, data, refs_only)
    assert any(len(requests[rows[i]["task_id"], rows[i]["step"]][0]) > 2 for i in idx) or refs_only  # a replayed call
    bad = []
    for i, (prompt_ids, _) in zip(idx, _labelled(trainer, idx), strict=True):
        messages, tools = requests[rows[i]["task_id"], rows[i]["step"]]
        served = V.serving_prompt(tok, template, messages, tools, opts["default_chat_template_kwargs"], fmt)
        if tok(served, add_special_tokens=False)["input_ids"] != prompt_ids:
            row = rows[i]
            bad.append((row["kind"], row["task_id"], row["step"], served[-80:], tok.decode(prompt_ids)[-80:]))
    return bad


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_every_trained_reply_parses_back_to_its_call_with_the_served_parser(built, case):
    bad = reply_mismatches(built, case, serve_options(case)["tool_call_parser"])
    assert not bad, bad[:3]


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_window_reference_replies_parse_back_as_the_reference_string(built, window_data, case):  # noqa: F811
    """ "{window:K}" in an array-typed time_range: hermes keeps the JSON string; Qwen3.5's XML value is not JSON, so
    qwen3_coder's schema conversion fails and keeps the text, which is the reference."""
    bad = reply_mismatches(built, case, serve_options(case)["tool_call_parser"], window_data, refs_only=True)
    assert not bad, bad[:3]


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_served_prompt_is_the_sft_prompt_token_for_token(built, case):
    bad = prompt_mismatches(built, case, serve_options(case))
    assert not bad, bad[:2]


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_served_prompt_of_window_reference_states_is_the_sft_prompt(built, window_data, case):  # noqa: F811
    bad = prompt_mismatches(built, case, serve_options(case), window_data, refs_only=True)
    assert not bad, bad[:2]


# ---- negative checks: what breaks the symmetry is caught ------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_the_other_parser_loses_every_trained_call(built, case):
    right = serve_options(case)["tool_call_parser"]
    wrong = serve_options(case, tool_call_parser=OTHER_PARSER[right])["tool_call_parser"]
    assert wrong != right
    bad = reply_mismatches(built, case, wrong)
    decisions = [i for i in _rows(built, case) if built.get(case)[1][i]["kind"] == "decision"]
    assert {b[0] for b in bad} == {"decision"} and len(bad) == len(decisions), bad[:2]


@pytest.mark.parametrize(
    "case,served_kwargs,differs",
    [
        # SFT renders with enable_thinking=false (the recipes): a server that leaves the template default differs
        # where the default is thinking (Qwen3, Qwen3.5 >= 4B, Qwen3-Omni), and one that turns it on differs everywhere
        # the template reads it; Qwen2.5's template has no such switch
        ("qwen2_5", {"enable_thinking": True}, False),
        ("qwen3", {}, True),
        ("qwen3", {"enable_thinking": True}, True),
        ("qwen3_5_think", {}, True),
        ("qwen3_5_think", {"enable_thinking": True}, True),
        ("qwen3_5_nothink", {}, False),
        ("qwen3_5_nothink", {"enable_thinking": True}, True),
        ("qwen3_omni", {}, True),
        ("qwen3_omni", {"enable_thinking": True}, True),
    ],
)
def test_enable_thinking_that_differs_from_sft_changes_every_served_prompt(built, case, served_kwargs, differs):
    opts = serve_options(case, default_chat_template_kwargs=served_kwargs)
    assert opts["default_chat_template_kwargs"] == served_kwargs
    bad = prompt_mismatches(built, case, opts)
    assert len(bad) == (len(_rows(built, case)) if differs else 0), bad[:2]


@pytest.mark.parametrize("case", sorted(FAMILIES))
def test_vllms_auto_content_format_breaks_qwen3_omni_only(built, case):
    """--chat-template-content-format auto hands Qwen3.5 and Qwen3-Omni lists of text parts: Qwen3.5's template
    renders them as the strings SFT saw, Qwen3-Omni's rejects a request with tools and a system message (vLLM: 400,
    the fixture's error), so serve/vllm.py passes `string`."""
    opts = serve_options(case, chat_template_content_format="auto")
    if case == "qwen3_omni":
        with pytest.raises(TypeError, match="can only concatenate list"):
            prompt_mismatches(built, case, opts)
    else:
        assert prompt_mismatches(built, case, opts) == []
