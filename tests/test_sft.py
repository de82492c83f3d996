"""sft.train: TRL SFT of the tiny planner (full fine-tune and LoRA), labels, merge, recipes."""

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import ModelConfig, SFTConfig

from collect import teacher_runs
from collect.actions import Action
from collect.harvest import harvest
from sft.train import SFTScriptArguments, build_trainer, load_sft_dataset, main, parse_args

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model, recorded_correct_runs):
    """The session's tiny model (read-only: every run writes to its own output_dir) and the SFT rows harvested from
    the first 12 recorded teacher runs."""
    d = tmp_path_factory.mktemp("sft")
    teacher_runs.write_trajectories(d / "traj.jsonl", recorded_correct_runs[:12])
    harvest(d / "traj.jsonl", d / "data", eval_share=0.2)
    return d, tiny_model


def _args(config, d, base, out, *extra):
    return parse_args(
        [
            "--config",
            str(ROOT / config),
            "--dataset_dir",
            str(d / "data" / "sft"),
            "--model_name_or_path",
            str(base),
            "--output_dir",
            str(out),
            "--logging_steps",
            "2",
            *extra,
        ]
    )


def test_collated_labels_cover_exactly_the_action_tokens(setup):
    d, base = setup
    trainer, dataset = build_trainer(*_args("configs/sft/tiny.yaml", d, base, d / "lab", "--kinds", "decision"))
    tok = trainer.processing_class
    n = 3
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(n)])
    for i in range(n):
        tc = dataset["train"][i]["completion"][0]["tool_calls"][0]["function"]
        expected = Action(tc["name"], tc["arguments"]).to_text() + "<|im_end|>"  # arguments: a mapping
        ids, labels = batch["input_ids"][i], batch["labels"][i]
        trained = ids[labels != -100]
        assert tok.decode(trained) == expected
        first = int((labels != -100).nonzero()[0])
        assert tok.decode(ids[:first]).endswith("<|im_start|>assistant\n")  # nothing of the prompt is trained


def test_cpu_compact_lm_head_scores_only_labelled_positions_with_the_same_loss_and_gradients(setup, monkeypatch):
    from trl.trainer import utils as trl_utils

    from sft.lm_head import compact_lm_head_on_cpu, restore_lm_head

    d, base = setup
    trainer, _ = build_trainer(*_args("configs/sft/tiny.yaml", d, base, d / "compact", "--kinds", "decision"))
    cpu = torch.device("cpu")
    assert trl_utils._use_triton(cpu)  # build_trainer on CPU switched the fused head to the compact path
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    n_labelled = int((batch["labels"][:, 1:] != -100).sum())
    seen = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *a):
        seen.append(hidden.shape[0])
        return apply(hidden, *a)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    model = trainer.model

    def step():
        model.zero_grad()
        out = model(**batch, fused_lm_head=True)
        out.loss.backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    compact, g_compact = step()
    restore_lm_head()
    try:
        assert not trl_utils._use_triton(cpu)
        full, g_full = step()
    finally:
        compact_lm_head_on_cpu()
    b, length = batch["input_ids"].shape
    assert seen == [n_labelled, b * (length - 1)]  # compact: the action tokens only; full: every position
    assert n_labelled < b * (length - 1) / 5
    assert torch.allclose(compact.loss, full.loss, atol=1e-5)
    assert torch.equal(compact.label_mask, full.label_mask)
    assert torch.allclose(compact.entropy, full.entropy, atol=1e-4)
    assert g_compact.keys() == g_full.keys() and len(g_full) > 10
    for name in g_full:
        assert torch.allclose(g_compact[name], g_full[name], atol=1e-5, rtol=1e-4), name


def test_full_finetune_loss_falls_weights_change_and_merged_checkpoint_generates(setup):
    d, base = setup
    out = d / "full"
    summary = main(
        *_args(
            "configs/sft/tiny.yaml",
            d,
            base,
            out,
            "--max_steps",
            "16",
            "--max_train_samples",
            "16",
            "--warmup_steps",
            "0",
            "--lr_scheduler_type",
            "constant",
        )
    )
    assert summary["steps"] == 16 and not summary["use_peft"]
    assert len(summary["losses"]) >= 4 and summary["last_loss"] < summary["first_loss"] - 0.5
    written = json.loads((out / "train_summary.json").read_text())
    assert written["steps"] == 16
    # the run's inputs, digested so that two hosts' runs can be compared: the base's own files, the rows it trained on
    inputs = written["inputs"]
    assert inputs["tokenizer_sha256"] == hashlib.sha256((base / "tokenizer.json").read_bytes()).hexdigest()
    assert inputs["base_weights_sha256"] == {
        "model.safetensors": hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest()
    }
    assert written["host"]["torch"] == torch.__version__ and written["host"]["torch_threads"] >= 1
    args = _args("configs/sft/tiny.yaml", d, base, out, "--max_train_samples", "16")[0]
    again = load_sft_dataset(args).rows_sha256
    assert again["train"] == inputs["train_rows_sha256"] and again["eval"] == inputs["eval_rows_sha256"]
    fewer = load_sft_dataset(_args("configs/sft/tiny.yaml", d, base, out, "--max_train_samples", "15")[0])
    assert fewer.rows_sha256["train"] != inputs["train_rows_sha256"]
    assert fewer.rows_sha256["eval"] == inputs["eval_rows_sha256"]
    w0, w1 = load_file(base / "model.safetensors"), load_file(out / "merged" / "model.safetensors")
    changed = [k for k in w0 if not torch.equal(w0[k], w1[k])]
    assert any("mlp" in k for k in changed) and any("self_attn" in k for k in changed)
    tok = AutoTokenizer.from_pretrained(out / "merged")
    model = AutoModelForCausalLM.from_pretrained(out / "merged")
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "Question: x"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert model.generate(**enc, max_new_tokens=5, do_sample=False).shape[1] > enc["input_ids"].shape[1]


def test_lora_trains_adapter_only_and_merge_equals_base_plus_delta(setup):
    d, base = setup
    out = d / "lora"
    summary = main(*_args("configs/sft/tiny_lora.yaml", d, base, out, "--max_steps", "4"))
    assert summary["use_peft"] and summary["steps"] == 4
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert set(cfg["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    adapter = load_file(out / "adapter_model.safetensors")
    lora_b = {k: v for k, v in adapter.items() if "lora_B" in k}
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b.values())  # B starts at zero: it was trained
    w0, wm = load_file(base / "model.safetensors"), load_file(out / "merged" / "model.safetensors")
    assert w0.keys() == wm.keys()
    scale = cfg["lora_alpha"] / cfg["r"]
    for k in w0:
        targeted = any(f"self_attn.{m}.weight" in k for m in cfg["target_modules"])
        if not targeted:
            assert torch.equal(w0[k], wm[k]), k  # untouched base weights
            continue
        prefix = k.removesuffix(".weight")
        a = next(v for n, v in adapter.items() if n.endswith(prefix.split("model.", 1)[1] + ".lora_A.weight"))
        b = next(v for n, v in adapter.items() if n.endswith(prefix.split("model.", 1)[1] + ".lora_B.weight"))
        # merged = frozen base + scale * B @ A: the base itself did not move
        torch.testing.assert_close(wm[k], w0[k] + scale * (b @ a), rtol=1e-4, atol=1e-5)
    model = AutoModelForCausalLM.from_pretrained(out / "merged")
    tok = AutoTokenizer.from_pretrained(out / "merged")
    enc = tok("hello", return_tensors="pt")
    assert model.generate(**enc, max_new_tokens=3, do_sample=False).shape[1] > enc["input_ids"].shape[1]


def test_tiny_recipe_is_a_cpu_full_finetune_that_builds_its_base():
    script, train, model = parse_args(["--config", str(ROOT / "configs/sft/tiny.yaml")])
    assert script.build_tiny and not model.use_peft
    assert train.assistant_only_loss and train.max_steps >= 100 and train.learning_rate >= 1e-3
    if not torch.cuda.is_available():
        assert train.use_cpu and not train.bf16


@pytest.mark.parametrize("name", ["qwen3_5_27b", "qwen3_omni_30b"])
def test_gpu_recipes_use_known_fields_bf16_and_attention_lora(name):
    cfg = yaml.safe_load((ROOT / f"configs/sft/{name}.yaml").read_text())
    known = {f.name for cls in (SFTScriptArguments, SFTConfig, ModelConfig) for f in dataclasses.fields(cls)}
    assert set(cfg) <= known, set(cfg) - known
    assert cfg["use_peft"] and cfg["bf16"] and cfg["lora_target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    acc = yaml.safe_load((ROOT / "configs/accelerate/zero3.yaml").read_text())
    assert acc["deepspeed_config"]["zero_stage"] == 3 and acc["deepspeed_config"]["zero3_init_flag"]
    assert acc["deepspeed_config"]["zero3_save_16bit_model"] and acc["mixed_precision"] == "bf16"


def test_a_run_shorter_than_logging_steps_reports_its_mean_loss(setup, capsys):
    """max_steps < logging_steps logs no step: the summary says so with the trainer's mean loss, not "None -> None"."""
    d, base = setup
    out = d / "short"
    summary = main(*_args("configs/sft/tiny.yaml", d, base, out, "--kinds", "decision", "--max_steps", "1"))
    assert summary["steps"] == 1 and summary["losses"] == [] and summary["first_loss"] is None
    printed = capsys.readouterr().out
    assert f"mean loss {summary['train_loss']:.4f} (no step logged" in printed and "None -> None" not in printed
    assert summary["train_loss"] > 0
