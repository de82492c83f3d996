"""The README's GPU chain connects (issues 51 and 54): each command of quickstart (c), as written, hands its output to
the next (teacher data -> SFT OUT/merged -> GRPO OUT -> the served checkpoint -> the served name the eval asks for),
the recipes' own defaults agree with it, for Qwen3.5-27B and Qwen3-Omni-30B; and on CPU the chain runs on a
random-initialised, scaled-down real Qwen3.5 (the vision-language checkpoint layout) through sft.train and rl.train
with the GPU recipes, then the vLLM command is built for the GRPO output (not started) and the eval's planner spec is
the served name."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from pipeline.planners import parse_planner_arg
from serve.checks import checkpoint_problem
from serve.vllm import VLLMServeConfig, build_vllm_command

ROOT = Path(__file__).resolve().parents[1]


def _quickstart_c() -> dict[str, dict[str, str]]:
    """`make` target -> its VAR=value words, from the README's quickstart (c) block, as written."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart (c)", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    steps: dict[str, dict[str, str]] = {}
    for line in lines:
        words = shlex.split(line.split(" #", 1)[0]) if line.strip() else []  # URL#model is not a comment
        if "make" not in words:
            continue
        i = words.index("make")
        target = words[i + 1]
        env = dict(w.split("=", 1) for w in words[:i] + words[i + 2 :] if "=" in w)
        steps[target] = env
    return steps


def test_every_step_of_the_gpu_quickstart_reads_what_the_step_before_wrote():
    s = _quickstart_c()
    assert list(s) == ["gpu-setup", "collect", "sft", "rl", "serve", "eval"]
    collect = yaml.safe_load((ROOT / s["collect"]["CONFIG"]).read_text())
    assert collect["split"] == "train" and collect["harvest"]["enabled"]  # training rows from the train split only
    assert s["sft"]["DATA"] == s["rl"]["DATA"] == s["collect"]["OUT"]
    sft = yaml.safe_load((ROOT / s["sft"]["CONFIG"]).read_text())
    assert s["rl"]["MODEL"] == f"{s['sft']['OUT']}/merged"  # sft.train writes OUT/merged
    assert s["sft"]["OUT"] == sft["output_dir"]  # the recipe's own default is the same folder
    rl = yaml.safe_load((ROOT / s["rl"]["CONFIG"]).read_text())
    assert rl["model_name_or_path"] == s["rl"]["MODEL"] and rl["output_dir"] == s["rl"]["OUT"]
    assert not rl["use_peft"]  # GRPO writes full weights to OUT: a checkpoint vLLM serves without a merge
    serve = VLLMServeConfig.from_yaml(ROOT / s["serve"]["CONFIG"], {"model": s["serve"]["MODEL"]})
    assert serve.model == s["rl"]["OUT"] and serve.layout == "merged"
    url, _, name = s["eval"]["PLANNER"].partition("#")
    u = urlsplit(url)
    assert (u.hostname, u.port, name) == (serve.host, serve.port, serve.served_model_name)
    assert parse_planner_arg(s["eval"]["PLANNER"])["endpoint"]["model"] == serve.served_model_name == "planner"
    assert s["eval"]["SPLIT"] == "test"  # the declared test split: Medium + Hard, never trained on
    assert sft["chat_template_kwargs"] == '{"enable_thinking": false}'
    assert serve.default_chat_template_kwargs == {"enable_thinking": False}  # prompts rendered as SFT rendered them


def test_the_omni_recipes_hand_on_the_same_way():
    sft = yaml.safe_load((ROOT / "configs/sft/qwen3_omni_30b.yaml").read_text())
    serve = VLLMServeConfig.from_yaml(ROOT / "configs/serve/qwen3_omni_30b_merged.yaml")
    assert serve.model == f"{sft['output_dir']}/merged" and serve.served_model_name == "planner"
    assert serve.family == "qwen3-omni" and serve.layout == "merged"  # vLLM has no LoRA for it
    assert sft["dataset_dir"] == "runs/omnigaia/sft"


@pytest.mark.slow
def test_the_chain_runs_on_a_scaled_down_qwen3_5_through_the_gpu_recipes(tmp_path):
    """sft.train (configs/sft/qwen3_5_27b.yaml) -> rl.train (configs/rl/qwen3_5_27b.yaml, full-parameter GRPO from
    OUT/merged with its KL reference) -> the vLLM command for the GRPO output (built, not started); only what a CPU
    cannot do is overridden (bf16, vLLM generation, the judge endpoint, sizes)."""
    from collect import teacher_runs
    from collect.harvest import harvest
    from rl.train import load_config as rl_config
    from rl.train import train
    from sft.tiny import train_tokenizer
    from sft.train import main as sft_main
    from sft.train import parse_args as sft_args
    from tests.helpers.real_arch import _tiny_qwen3_5

    data = tmp_path / "runs" / "omnigaia"
    teacher_runs.write_trajectories(tmp_path / "traj.jsonl", teacher_runs.trajectories(4))
    harvest(tmp_path / "traj.jsonl", data, eval_share=0.0)
    base = _tiny_qwen3_5(tmp_path / "models" / "Qwen3.5-27B", train_tokenizer(teacher_runs.texts(8), vocab_size=800))
    sft_out = tmp_path / "runs" / "sft" / "qwen3_5_27b"
    cpu = ["--bf16", "false", "--dtype", "float32", "--max_steps", "1", "--warmup_steps", "0"]
    sft_main(
        *sft_args(
            ["--config", str(ROOT / "configs/sft/qwen3_5_27b.yaml"), "--model_name_or_path", str(base)]
            + ["--dataset_dir", str(data / "sft"), "--output_dir", str(sft_out), *cpu, "--max_train_samples", "2"]
            + ["--gradient_accumulation_steps", "1", "--eval_strategy", "no", "--save_strategy", "no"]
            + ["--max_length", "4096", "--gradient_checkpointing", "false"]
        )
    )
    assert checkpoint_problem(sft_out / "merged") is None
    rl_out = tmp_path / "runs" / "rl" / "qwen3_5_27b"
    overrides = {
        "model_name_or_path": str(sft_out / "merged"),  # the README's MODEL=runs/sft/qwen3_5_27b/merged
        "dataset_dir": str(data / "rl_states"),
        "output_dir": str(rl_out),
        "bf16": False,
        "dtype": "float32",
        "use_vllm": False,
        "gradient_checkpointing": False,
        "max_steps": 1,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "max_completion_length": 8,
        "max_train_samples": 2,
        "judge": {"kind": "offline"},
        "report_to": "none",
        "save_strategy": "no",
        "warmup_steps": 0,
    }
    _, summary = train(rl_config(str(ROOT / "configs/rl/qwen3_5_27b.yaml"), overrides))
    assert summary["steps"] == 1 and summary["reference_policy"] == "full_ft_ref_loaded_from_sft_checkpoint"
    assert checkpoint_problem(rl_out) is None  # servable as written: config, weights, tokenizer
    serve = VLLMServeConfig.from_yaml(ROOT / "configs/serve/qwen3_5_27b_merged.yaml", {"model": str(rl_out)})
    cmd = build_vllm_command(serve)
    assert cmd[:3] == ["vllm", "serve", str(rl_out)] and cmd[cmd.index("--served-model-name") + 1] == "planner"
    assert cmd[cmd.index("--tool-call-parser") + 1] == "qwen3_coder"
    spec = parse_planner_arg(f"http://{serve.host}:{serve.port}/v1#{serve.served_model_name}")
    assert spec["endpoint"]["model"] == "planner"
