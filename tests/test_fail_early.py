"""Commands fail before doing work, with one line that says what to do (issue 52, class 10): vLLM not installed, a
checkpoint folder that is not one, a port in use, an endpoint key typo in an eval recipe, missing SFT data."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert all(w in r.stderr for w in words), r.stderr[-2000:]


def test_make_serve_without_vllm_says_to_install_the_gpu_stack(tmp_path):
    """Before: a FileNotFoundError traceback from Popen."""
    cfg = yaml.safe_load((ROOT / "configs/serve/qwen3_5_27b_merged.yaml").read_text())
    cfg |= {"executable": "vllm-not-installed-here", "model": str(tmp_path)}
    p = tmp_path / "serve.yaml"
    p.write_text(yaml.safe_dump(cfg))
    _one_line_error(_run("serve.vllm", "--config", str(p)), "'vllm-not-installed-here' is not installed", "gpu-setup")
    assert _run("serve.vllm", "--config", str(p), "--dry-run").returncode == 0  # the command is still printable


def test_a_folder_with_only_config_json_is_named_as_not_a_checkpoint(tmp_path):
    """Before: serve.local (and eval's served planners) went on to a sentencepiece / tiktoken error."""
    (tmp_path / "config.json").write_text("{}")
    r = _run("serve.local", "--model", str(tmp_path), "--port", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "is not a save_pretrained checkpoint: it has no weights" in r.stderr and "no a tokenizer" in r.stderr
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "config.json").unlink()
    r = _run("serve.local", "--model", str(tmp_path))
    assert "is a LoRA adapter, not a full model" in r.stderr and "OUT/merged" in r.stderr


def test_a_port_in_use_is_found_before_the_model_loads(tiny_model):
    """Before: the model loaded (seconds to minutes), then uvicorn failed to bind."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run("serve.local", "--model", str(tiny_model), "--port", str(port))
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}: in use by another process" in r.stderr
    assert "Loading" not in r.stderr and "Traceback" not in r.stderr


def test_an_endpoint_key_typo_in_an_eval_recipe_fails_at_load_naming_the_planner(tmp_path):
    """Before: a TypeError after the first cell had run."""
    p = tmp_path / "e.yaml"
    planners = {
        "teacher": "offline",
        "api": {"endpoint": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_tokenz": 64}},
    }
    p.write_text(yaml.safe_dump({"split": "test", "limit": 1, "planners": planners}))
    out = tmp_path / "out"
    r = _run("pipeline.eval", "--config", str(p), "--out", str(out))
    _one_line_error(r, "planners.api.endpoint.max_tokenz: unknown key", "did you mean 'max_tokens'?")
    assert not (out / "cells").exists()  # nothing ran: the teacher's cell is not started first


def test_sft_on_a_missing_dataset_writes_no_base_model(tmp_path):
    """Before: the tiny base model (~5 MB) was built into OUT, then the run failed on the data."""
    out = tmp_path / "sft"
    r = _run("sft.train", "--config", "configs/sft/tiny.yaml", "--dataset_dir", str(tmp_path / "missing"),
             "--output_dir", str(out))  # fmt: skip
    _one_line_error(r, "dataset_dir", "does not exist: run collect (harvest) first")
    assert not out.exists() or not any(out.rglob("*.safetensors"))
