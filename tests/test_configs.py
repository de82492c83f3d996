"""Every shipped recipe parses into its config dataclasses (a typo in a YAML key must fail here, not on a GPU node)."""

from pathlib import Path

import pytest

from collect.config import load_config
from collect.tools import ToolsConfig
from pipeline.eval import load_eval_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs/collect").glob("*.yaml")), ids=lambda p: p.name)
def test_collect_recipes_parse(path):
    cfg = load_config(path)
    ToolsConfig(**cfg.tools)
    assert cfg.runtime.max_steps == 15  # the paper's T unless a recipe says otherwise on purpose


@pytest.mark.parametrize("path", sorted((ROOT / "configs/eval").glob("*.yaml")), ids=lambda p: p.name)
def test_eval_recipes_parse_and_point_at_existing_bases(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_eval_config(str(path))
    assert (ROOT / cfg.base).exists()
    load_config(ROOT / cfg.base)


@pytest.mark.parametrize("path", sorted((ROOT / "configs/onpolicy").glob("*.yaml")), ids=lambda p: p.name)
def test_onpolicy_recipes_parse_with_their_stage_overrides(path, monkeypatch, tmp_path):
    """An on-policy recipe names a collect, an SFT and an RL recipe and passes sft_args / rl_args to them on the
    command line (pipeline.onpolicy._flags): each must exist and each override must be a flag that stage accepts and
    that lands in its config, or the run fails after its relabel (or silently trains with the recipe's value)."""
    from pipeline.onpolicy import _flags, load_onpolicy_config
    from rl.train import load_config as load_rl_config
    from sft.train import parse_args as parse_sft_args

    monkeypatch.chdir(ROOT)
    cfg = load_onpolicy_config(str(path))
    load_config(ROOT / cfg.collect)
    sft = parse_sft_args(
        ["--config", cfg.sft_config, "--dataset_dir", str(tmp_path), "--output_dir", str(tmp_path / "sft")]
        + _flags(cfg.sft_args)
    )
    for key, value in cfg.sft_args.items():
        assert [getattr(c, key) for c in sft if hasattr(c, key)] == [value], (path.name, key)
    if cfg.rl:
        rl = load_rl_config(cfg.rl_config, {"output_dir": str(tmp_path / "rl"), **cfg.rl_args})
        for key, value in cfg.rl_args.items():
            assert [getattr(c, key) for c in rl if hasattr(c, key)] == [value], (path.name, key)


def test_collect_config_rejects_unknown_keys(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("splitt: test\n")
    with pytest.raises(ValueError, match="splitt"):
        load_config(p)


# ---- one definition per value ---------------------------------------------------------------------------------------


def test_the_collect_recipe_classes_live_in_collect_config_and_the_engine_uses_them():
    import collect.config
    import collect.run

    for name in ("CollectConfig", "TaskSource", "load_config"):
        assert getattr(collect.run, name, getattr(collect.config, name)) is getattr(collect.config, name)
    assert collect.config.CollectConfig.__module__ == "collect.config"


def test_runtime_budget_defaults_are_the_ledgers_and_observation_caps_derive_from_one_constant():
    import inspect

    from collect.config import MAX_OBSERVATION_CHARS, RuntimeConfig
    from collect.ledger import Budget
    from collect.roles import render

    assert RuntimeConfig().budget() == Budget()
    assert RuntimeConfig(max_steps=7).budget() == Budget(max_steps=7)
    assert RuntimeConfig().max_observation_chars == MAX_OBSERVATION_CHARS
    for fn in (render.render_planner_messages, render.render_critic_messages, render.render_summarizer_messages):
        assert inspect.signature(fn).parameters["max_observation_chars"].default == MAX_OBSERVATION_CHARS
    # the tools cap raw output above what roles are shown, so the runtime's truncation note (how much was cut) is
    # what the planner reads
    assert ToolsConfig().max_observation_chars > MAX_OBSERVATION_CHARS


def test_insufficient_is_one_constant():
    import re

    defined = [
        p.relative_to(ROOT).as_posix()
        for p in sorted(ROOT.glob("[a-z]*/**/*.py"))
        if ".venv" not in p.parts and re.search(r"^INSUFFICIENT\s*=", p.read_text(), re.M)
    ]
    assert defined == ["collect/ledger.py"]


def test_ledger_counts_blocked_finishes_once_and_keeps_the_recorded_revisions_key():
    from collect.ledger import FinishBlocked, Ledger, initial_ledger, ledger_from_dict, reduce

    assert "revisions" not in Ledger.__dataclass_fields__ and not hasattr(initial_ledger(), "revisions")
    led = reduce(reduce(initial_ledger(), FinishBlocked("a", "not ready")), FinishBlocked("b", "not ready"))
    d = led.to_dict()
    assert d["blocked_finishes"] == d["revisions"] == 2
    keys = list(d)
    assert keys[keys.index("blocked_finishes") + 1] == "revisions"  # the recorded key order is unchanged
    assert ledger_from_dict(d) == led


def test_records_carry_the_engines_config_hash_written_once(tmp_path):
    import json

    from collect.run import run_collection

    cfg = load_config(ROOT / "configs/collect/embedded.yaml", {"split": "test", "limit": 1, "progress": False})
    run_collection(cfg, tmp_path)
    meta = json.loads((tmp_path / "run_config.json").read_text())
    recs = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(recs) == 1 and recs[0]["config_hash"] == meta["config_hash"] == cfg.hash()
