"""Bad recipes and task files (issue 16 class 10): every one exits 2 with a message naming the file and the field;
never a traceback (exit 1), never a silently coerced value."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from collect.__main__ import main as collect_main

ROOT = Path(__file__).resolve().parents[1]

CASES = {
    "yaml_syntax": ("name: x\ntasks: {kind: embedded\n", "YAML syntax error at line"),
    "top_level_list": ("- a\n- b\n", "expected a mapping of config keys at the top level, got list"),
    "limit_string": ('limit: "5"\n', "limit: expected an integer, got '5'"),
    "limit_negative": ("limit: -1\n", "limit: must be >= 1"),
    "runtime_wrong_type": ("runtime: {max_steps: ten}\n", "runtime.max_steps: expected an integer, got 'ten'"),
    "runtime_not_mapping": ("runtime: [1, 2]\n", "runtime: expected a mapping of RuntimeConfig fields"),
    "runtime_unknown_key": ("runtime: {max_stepz: 3}\n", "runtime.max_stepz: unknown key; expected one of"),
    "runtime_typo_is_named": ("runtime: {max_stepz: 3}\n", "did you mean 'max_steps'?"),
    "reference_kind_typo": ("runtime: {references: [need, windows]}\n", "allowed: ['need', 'window', 'focus']"),
    "limits_zero": ("runtime: {limits: {max_reply_chars: 0}}\n", "max_reply_chars must be a positive integer"),
    "n_tasks_zero": ("tasks: {kind: embedded, seed: 0, n_tasks: 0}\n", "tasks.n_tasks must be a positive integer"),
    "n_tasks_for_a_file": (
        "tasks: {kind: file, path: t.jsonl, n_tasks: 900}\n",
        "tasks.n_tasks sizes the embedded world; it has no meaning for tasks.kind='file'",
    ),
    "seed_as_string": ("tasks: {kind: embedded, seed: '0'}\n", "tasks.seed: expected an integer, got '0'"),
    "negative_code_limits": ("tools: {code_timeout_s: -1}\n", "code_timeout_s and media_timeout_s must be > 0"),
    "tools_wrong_type": ("tools: {top_k: many}\n", "tools.top_k: expected an integer"),
    "tools_unknown_key": ("tools: {web_backnd: bm25}\n", "tools.web_backnd: unknown key; expected one of"),
    "endpoint_wrong_type": (
        "endpoints: {e: {base_url: 'http://127.0.0.1:9/v1', model: m, timeout_s: soon}}\n",
        "endpoints.e.timeout_s: expected a number",
    ),
    "empty_file_is_defaults": None,
}


@pytest.mark.parametrize("name", sorted(k for k, v in CASES.items() if v))
def test_bad_recipe_exits_2_naming_file_and_field(tmp_path, capsys, name):
    text, expected = CASES[name]
    cfg = tmp_path / f"{name}.yaml"
    prefix = "" if text.startswith(("- ", "tasks:")) else "tasks: {kind: embedded, seed: 0}\n"
    cfg.write_text(prefix + text)
    rc = collect_main(["--config", str(cfg), "--out", str(tmp_path / "out"), "--no-harvest", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert str(cfg) in err and expected in err, err
    assert not (tmp_path / "out").exists()  # refused before OUT is touched


LOADERS = {  # every recipe that is not a trainer's goes through collect.config.load_recipe
    "eval": ("pipeline.eval", ["--out", "OUT"], "planers: {teacher: offline}\n", "planers: unknown key", "'planners'"),
    "onpolicy": (
        "pipeline.onpolicy",
        ["--model", ".", "--out", "OUT"],
        "round: 2\n",
        "round: unknown key",
        "'rounds'",
    ),
    "serve": ("serve.vllm", ["--dry-run"], "model: m\nfamily: qwen3\nprot: 1\n", "prot: unknown key", "'port'"),
}


@pytest.mark.parametrize("stage", sorted(LOADERS))
def test_every_recipe_loader_has_the_same_error_style(tmp_path, stage):
    """eval, on-policy and serve recipes: exit 2 before any work, the file, the field, the known keys, the closest."""
    module, args, text, field, near = LOADERS[stage]
    cfg = tmp_path / f"{stage}.yaml"
    cfg.write_text(text)
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    r = subprocess.run(
        [sys.executable, "-m", module, "--config", str(cfg), *argv], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{cfg}: {field}; expected one of" in r.stderr and f"did you mean {near}?" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_recipe_that_is_not_utf8_exits_2(tmp_path, capsys):
    cfg = tmp_path / "latin.yaml"
    cfg.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    assert collect_main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "latin.yaml: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, payload, expected",
    [
        ("deep.json", b"[" * 100_000 + b"]" * 100_000, "nested deeper than"),
        (
            "latin1.json",
            json.dumps([{"id": "t", "question": "caf\u00e9?"}], ensure_ascii=False).encode("latin-1"),
            "not UTF-8 text",
        ),
    ],
)
def test_bad_task_file_exits_2_naming_the_file(tmp_path, capsys, name, payload, expected):
    f = tmp_path / name
    f.write_bytes(payload)
    rc = collect_main(["--tasks", str(f), "--split", "all", "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and name in err and expected in err and "Traceback" not in err, err
