"""vLLM launcher for GPU nodes: a recipe (YAML) -> the `vllm serve` command line, run, wait for /v1/models.

    python -m serve.vllm --config configs/serve/qwen3_5_27b_lora.yaml [--dry-run]

Two layouts: `merged` (one standalone checkpoint, e.g. sft/train.py's OUT/merged) and `lora` (base weights + adapters
served with --enable-lora; clients pick an adapter by its module name). The tool-call parser follows the model family,
i.e. the form its chat template trains (tests/test_tool_call_symmetry.py parses every SFT row kind back with it):
Qwen2.5 / Qwen3 / Qwen3-Omni emit hermes-style `<tool_call>{json}</tool_call>` -> `hermes`; Qwen3.5 emits the XML form
-> `qwen3_coder` (vLLM's Qwen3.5 recipe; in vLLM 0.31 `qwen3_xml` is the same parser). The chat template gets message
content as strings (`--chat-template-content-format string`), as SFT rendered it: vLLM's auto-detection picks the
list-of-parts form for the Qwen3.5 and Qwen3-Omni templates, and Qwen3-Omni's template then rejects a request with
tools and a system message. vLLM has no LoRA support for Qwen3-Omni, so a LoRA layout for it is refused: merge first.
This module never imports vllm (the command runs in a subprocess), so it is testable on CPU.

What to serve from sft/train.py's OUT (docs/serving.md): `merged` -> OUT/merged (written in the base checkpoint's own
layout and config); `lora` -> OUT/vllm_adapter (module names of the base checkpoint). OUT itself holds the adapter
under the training class's names, which vLLM would not match (it skips unmatched LoRA modules), so it is refused.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from collect.cli import run_cli
from collect.config import load_recipe
from serve.checks import checkpoint_problem, port_problem

TOOL_CALL_PARSERS = {"qwen2.5": "hermes", "qwen3": "hermes", "qwen3.5": "qwen3_coder", "qwen3-omni": "hermes"}
CONTENT_FORMATS = ("string", "openai", "auto")
NO_LORA_FAMILIES = ("qwen3-omni",)


@dataclass
class VLLMServeConfig:
    """One served model. Paths are local (nothing is downloaded on the GPU node)."""

    model: str = field(metadata={"help": "merged checkpoint (layout merged) or base weights (layout lora)"})
    family: str = field(metadata={"help": f"model family: one of {sorted(TOOL_CALL_PARSERS)}"})
    layout: str = field(default="merged", metadata={"help": "merged | lora"})
    lora_modules: dict[str, str] = field(
        default_factory=dict, metadata={"help": "adapter name -> adapter dir (layout lora); clients use the name"}
    )
    max_lora_rank: int = field(default=16, metadata={"help": "--max-lora-rank: at least the adapters' r"})
    served_model_name: str | None = field(
        default="planner", metadata={"help": "name clients send as `model` (PLANNER=URL#planner)"}
    )
    host: str = field(default="127.0.0.1", metadata={"help": "bind address"})
    port: int = field(default=8000, metadata={"help": "HTTP port"})
    tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs per model replica"})
    max_model_len: int = field(default=16384, metadata={"help": "context length (prompt + completion)"})
    gpu_memory_utilization: float | None = field(default=None, metadata={"help": "vLLM default when unset"})
    dtype: str = field(default="bfloat16", metadata={"help": "weights/activations dtype"})
    tool_call_parser: str | None = field(default=None, metadata={"help": "override the family's parser"})
    default_chat_template_kwargs: dict = field(
        default_factory=dict,
        metadata={
            "help": "--default-chat-template-kwargs: what the chat template is rendered with when a request sends "
            "none. Set it to the SFT recipe's chat_template_kwargs (e.g. {enable_thinking: false}) so the served "
            "prompt ends exactly as the training prompts did"
        },
    )
    chat_template_content_format: str = field(
        default="string",
        metadata={
            "help": "--chat-template-content-format: string (message content as text, as sft.train renders it), "
            "openai (a list of parts) or auto (vLLM guesses from the template)"
        },
    )
    extra_args: list[str] = field(default_factory=list, metadata={"help": "appended verbatim"})
    startup_timeout_s: float = field(default=900.0, metadata={"help": "wait this long for /v1/models"})
    executable: str = field(default="vllm", metadata={"help": "the vllm CLI"})

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict | None = None) -> VLLMServeConfig:
        return load_recipe(cls, path, overrides, "serve recipe")


def build_vllm_command(cfg: VLLMServeConfig) -> list[str]:
    """The argv of `vllm serve` for this recipe; raises ValueError naming the bad field."""
    if cfg.family not in TOOL_CALL_PARSERS:
        raise ValueError(f"family {cfg.family!r} is not one of {sorted(TOOL_CALL_PARSERS)}")
    if cfg.layout not in ("merged", "lora"):
        raise ValueError(f"layout {cfg.layout!r} must be 'merged' or 'lora'")
    if cfg.chat_template_content_format not in CONTENT_FORMATS:
        fmt = cfg.chat_template_content_format
        raise ValueError(f"chat_template_content_format {fmt!r} must be one of {CONTENT_FORMATS}")
    cmd = [cfg.executable, "serve", cfg.model]
    if cfg.served_model_name:
        cmd += ["--served-model-name", cfg.served_model_name]
    if cfg.layout == "lora":
        if cfg.family in NO_LORA_FAMILIES:
            raise ValueError(
                f"layout 'lora' is not supported for family {cfg.family!r}: vLLM has no LoRA for Qwen3-Omni. "
                "Merge the adapter first (sft/train.py writes OUT/merged) and serve it with layout: merged"
            )
        if not cfg.lora_modules:
            raise ValueError("layout 'lora' needs lora_modules: {name: adapter_dir}")
        for name, path in cfg.lora_modules.items():
            if (Path(path) / "vllm_adapter").is_dir():
                raise ValueError(
                    f"lora_modules.{name}: {path} is an sft.train output directory whose adapter uses the training "
                    f"class's module names; serve {Path(path) / 'vllm_adapter'} (the base checkpoint's names)"
                )
        cmd += ["--enable-lora", "--max-lora-rank", str(cfg.max_lora_rank), "--lora-modules"]
        cmd += [f"{name}={path}" for name, path in cfg.lora_modules.items()]
    elif cfg.lora_modules:
        raise ValueError("lora_modules given with layout 'merged': set layout: lora or drop lora_modules")
    cmd += ["--host", cfg.host, "--port", str(cfg.port)]
    cmd += ["--tensor-parallel-size", str(cfg.tensor_parallel_size), "--max-model-len", str(cfg.max_model_len)]
    cmd += ["--dtype", cfg.dtype]
    if cfg.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    cmd += ["--enable-auto-tool-choice", "--tool-call-parser", cfg.tool_call_parser or TOOL_CALL_PARSERS[cfg.family]]
    if cfg.default_chat_template_kwargs:
        cmd += ["--default-chat-template-kwargs", json.dumps(cfg.default_chat_template_kwargs, sort_keys=True)]
    cmd += ["--chat-template-content-format", cfg.chat_template_content_format]
    return cmd + list(cfg.extra_args)


def wait_until_ready(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll GET {url}/v1/models until it answers 200; fail early if the server process died."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"vllm exited with code {proc.returncode} before {url}/v1/models answered")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2.0)
    raise TimeoutError(f"{url}/v1/models did not answer within {timeout_s}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="launch vLLM for a serving recipe")
    ap.add_argument("--config", required=True, help="configs/serve/*.yaml")
    ap.add_argument("--model", default=None, help="serve this checkpoint instead of the recipe's `model`")
    ap.add_argument("--dry-run", action="store_true", help="print the command and exit")
    a = ap.parse_args(argv)
    try:
        cfg = VLLMServeConfig.from_yaml(a.config, {"model": a.model})
        cmd = build_vllm_command(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(shlex.join(cmd), flush=True)
    if a.dry_run:
        return 0
    if shutil.which(cfg.executable) is None:
        problem = f"the vLLM command {cfg.executable!r} is not installed: on a GPU node run make gpu-setup"
    else:  # vLLM takes minutes to load a model: what would stop it later is checked now
        problem = checkpoint_problem(cfg.model) or port_problem(cfg.host, cfg.port)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    proc = subprocess.Popen(cmd)
    try:
        wait_until_ready(f"http://{cfg.host}:{cfg.port}", cfg.startup_timeout_s, proc)
        print(f"vllm ready: http://{cfg.host}:{cfg.port}/v1", flush=True)
        return proc.wait()
    except (KeyboardInterrupt, TimeoutError, RuntimeError) as e:
        print(f"serve.vllm: {e}", file=sys.stderr)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 1


if __name__ == "__main__":
    run_cli(main, "the server was stopped")
