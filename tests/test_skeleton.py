"""The project is importable from the repository root and its configuration is coherent."""

import importlib
import pathlib
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ["collect", "sft", "rl", "rewards", "serve", "pipeline"]


@pytest.mark.parametrize("name", PACKAGES)
def test_top_level_packages_import_from_repo_root(name):
    mod = importlib.import_module(name)
    assert pathlib.Path(mod.__file__).resolve().parent == ROOT / name


def test_distribution_does_not_publish_generic_package_names():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert cfg["tool"]["setuptools"]["packages"] == []


def test_cpu_torch_is_pinned_and_gpu_packages_are_optional():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = cfg["project"]["dependencies"]
    assert "torch==2.13.0" in (ROOT / "constraints/cpu.txt").read_text().split()
    assert "TORCH_CONSTRAINT ?= -c constraints/cpu.txt" in (ROOT / "Makefile").read_text()
    assert any(d.startswith("torch") for d in deps)
    assert not any(d.startswith(("vllm", "deepspeed")) for d in deps)
    gpu = cfg["project"]["optional-dependencies"]["gpu"]
    assert any(d.startswith("vllm") for d in gpu) and any(d.startswith("deepspeed") for d in gpu)


def test_installed_torch_is_the_cpu_build_pinned_in_constraints():
    import torch

    pin = [ln for ln in (ROOT / "constraints/cpu.txt").read_text().splitlines() if ln.startswith("torch==")][0]
    assert torch.__version__.split("+")[0] == pin.split("==")[1]


def test_pytest_markers_deselect_gpu_and_vllm_by_default():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "not gpu and not vllm" in cfg["addopts"]
    names = {m.split(":")[0] for m in cfg["markers"]}
    assert {"gpu", "vllm", "slow"} <= names


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text().splitlines()
    assert "set -euo pipefail" in ci
    cmd = [ln for ln in ci if ln and not ln.startswith(("#", "set "))]
    assert cmd == ["make test"]
    assert "make test" in (ROOT / "README.md").read_text()


def test_every_cpu_pin_is_the_installed_version():
    """constraints/cpu.txt pins the whole CPU stack (reproducible fresh clones), constraints/gpu.txt a GPU node's: an
    install made with it has exactly those versions, so a pin that pip could not honour, or a venv made without it,
    shows here."""
    import importlib.util
    from importlib.metadata import version

    # a GPU node's venv is the gpu.txt stack (make gpu-setup: vLLM and the transformers it caps), a CPU one cpu.txt's
    stack = "gpu.txt" if importlib.util.find_spec("vllm") else "cpu.txt"
    pins = [ln.split("==") for ln in (ROOT / "constraints" / stack).read_text().splitlines() if "==" in ln]
    assert len(pins) > 50 and {"transformers", "trl", "peft", "datasets", "tokenizers"} <= {n for n, _ in pins}
    wrong = {n: (v, version(n)) for n, v in pins if version(n).split("+")[0] != v}
    assert not wrong
