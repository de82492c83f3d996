"""Every shipped recipe parses into its config dataclasses (a typo in a YAML key must fail here, not on a GPU node)."""

from pathlib import Path

import pytest

from collect.run import load_config
from collect.tools import ToolsConfig
from serve.eval import load_eval_config

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


def test_collect_config_rejects_unknown_keys(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("splitt: test\n")
    with pytest.raises(ValueError, match="splitt"):
        load_config(p)
