"""serve.local (OpenAI-compatible server for a tiny checkpoint, via the real openai client) and serve.vllm commands."""

import json
import threading
from pathlib import Path

import pytest
import torch
import yaml

from collect.actions import Action
from collect.ledger import TaskContext
from collect.tools import tool_schemas
from serve.local import LocalServer, parse_tool_calls
from serve.vllm import VLLMServeConfig, build_vllm_command

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
ACTION = Action("web_search", {"query": "harbour bridge height", "need_index": 1})
MESSAGES = [{"role": "system", "content": "You are the planner."}, {"role": "user", "content": "Question: height?"}]
TOOLS = tool_schemas(TaskContext("serve", "height?", allowed_tools=("web_search", "finish")))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_model):
    """A copy of the session's tiny model taught (40 full-FT steps on one example) to answer MESSAGES with ACTION."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = shutil.copytree(tiny_model, tmp_path_factory.mktemp("serve") / "m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    call = ACTION.to_tool_call()
    full = tok.apply_chat_template(
        MESSAGES + [{"role": "assistant", "content": "", "tool_calls": [call]}],
        tools=TOOLS,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = torch.tensor([full["input_ids"]])
    labels = ids.clone()
    labels[0, torch.tensor(full["assistant_masks"]) == 0] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(40):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(path)
    return path


def test_openai_client_gets_parsed_tool_calls_and_usage(checkpoint):
    import openai

    with LocalServer(checkpoint, name="tiny") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=64)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (tc,) = choice.message.tool_calls
    assert tc.id.startswith("call_") and tc.type == "function"
    assert tc.function.name == ACTION.name and json.loads(tc.function.arguments) == ACTION.arguments
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 64
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_tokens_is_honoured_and_concurrent_requests_are_served(checkpoint):
    import openai

    results = []
    with LocalServer(checkpoint) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="unused", max_retries=0)

        def ask():
            results.append(
                client.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=3)
            )

        threads = [threading.Thread(target=ask) for _ in range(3)]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert len(results) == 3
    for r in results:
        assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
        assert not r.choices[0].message.tool_calls  # the call was cut off: no half-parsed action


def test_parse_tool_calls_keeps_malformed_blocks_as_content():
    content, calls = parse_tool_calls(ACTION.to_text())
    assert content is None and len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == ACTION.arguments
    bad = '<tool_call>\n{"name": "web_search", "arguments": {\n</tool_call>'
    assert parse_tool_calls(bad) == (bad, [])


def _cfg(**kw):
    return VLLMServeConfig(**{"model": "/m/base", "family": "qwen3", **kw})


def _opt(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_vllm_lora_layout_command():
    cmd = build_vllm_command(
        _cfg(
            layout="lora",
            lora_modules={"planner": "/a/sft"},
            max_lora_rank=32,
            port=9001,
            served_model_name="base",
            tensor_parallel_size=2,
            max_model_len=8192,
        )
    )
    assert cmd[:3] == ["vllm", "serve", "/m/base"] and "--enable-lora" in cmd
    assert _opt(cmd, "--lora-modules") == "planner=/a/sft" and _opt(cmd, "--max-lora-rank") == "32"
    assert _opt(cmd, "--port") == "9001" and _opt(cmd, "--served-model-name") == "base"
    assert _opt(cmd, "--tensor-parallel-size") == "2" and _opt(cmd, "--max-model-len") == "8192"
    assert "--enable-auto-tool-choice" in cmd and _opt(cmd, "--tool-call-parser") == "hermes"


def test_vllm_merged_layout_has_no_lora_flags():
    cmd = build_vllm_command(_cfg(model="/runs/merged", served_model_name="planner"))
    assert cmd[2] == "/runs/merged" and not any("lora" in c for c in cmd)
    with pytest.raises(ValueError, match="layout 'merged'"):
        build_vllm_command(_cfg(lora_modules={"x": "/a"}))


@pytest.mark.parametrize(
    "family,parser", [("qwen2.5", "hermes"), ("qwen3", "hermes"), ("qwen3.5", "qwen3_coder"), ("qwen3-omni", "hermes")]
)
def test_vllm_tool_call_parser_follows_model_family(family, parser):
    """Why each parser: tests/test_tool_call_symmetry.py (every trained row kind parses back with it)."""
    cmd = build_vllm_command(_cfg(family=family))
    assert _opt(cmd, "--tool-call-parser") == parser
    assert _opt(cmd, "--chat-template-content-format") == "string"  # message content as SFT rendered it


def test_vllm_content_format_is_checked():
    assert _opt(build_vllm_command(_cfg(chat_template_content_format="auto")), "--chat-template-content-format") == (
        "auto"
    )
    with pytest.raises(ValueError, match="chat_template_content_format 'text'"):
        build_vllm_command(_cfg(chat_template_content_format="text"))


def test_vllm_refuses_lora_for_qwen3_omni_and_unknown_family():
    with pytest.raises(ValueError, match="Merge the adapter"):
        build_vllm_command(_cfg(family="qwen3-omni", layout="lora", lora_modules={"p": "/a"}))
    with pytest.raises(ValueError, match="family 'llama'"):
        build_vllm_command(_cfg(family="llama"))


@pytest.mark.parametrize("name", ["qwen3_5_27b_lora", "qwen3_5_27b_merged", "qwen3_omni_30b_merged"])
def test_vllm_serve_recipes_build(name):
    cfg = VLLMServeConfig.from_yaml(ROOT / f"configs/serve/{name}.yaml")
    cmd = build_vllm_command(cfg)
    assert ("--enable-lora" in cmd) == name.endswith("_lora")
    assert _opt(cmd, "--tool-call-parser") == ("qwen3_coder" if "qwen3_5" in name else "hermes")


@pytest.mark.parametrize(
    "serve,sft",
    [
        ("qwen3_5_27b_lora", "qwen3_5_27b"),
        ("qwen3_5_27b_merged", "qwen3_5_27b"),
        ("qwen3_omni_30b_merged", "qwen3_omni_30b"),
    ],
)
def test_vllm_serves_with_the_chat_template_kwargs_the_planner_was_trained_with(serve, sft):
    """A prompt rendered with enable_thinking=false at training but the template default at serving differs in its
    last tokens (Qwen3.5 / Qwen3-Omni add an empty think block): the serve recipe must pass the SFT recipe's kwargs."""
    trained = json.loads(yaml.safe_load((ROOT / f"configs/sft/{sft}.yaml").read_text())["chat_template_kwargs"])
    cmd = build_vllm_command(VLLMServeConfig.from_yaml(ROOT / f"configs/serve/{serve}.yaml"))
    assert trained and json.loads(_opt(cmd, "--default-chat-template-kwargs")) == trained


def test_vllm_dry_run_prints_command_without_importing_vllm(capsys):
    import sys

    from serve.vllm import main

    assert main(["--config", str(ROOT / "configs/serve/qwen3_5_27b_merged.yaml"), "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("vllm serve runs/sft/qwen3_5_27b/merged")
    assert "vllm" not in sys.modules
