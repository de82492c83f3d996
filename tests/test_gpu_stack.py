"""The GPU stack (pyproject's gpu extra + constraints/gpu.txt), checked offline; `make gpu-resolve` asks PyPI.

What is checked here without a network: vLLM's pin is inside the window of the installed TRL's `vllm` extra, the
project's own ranges admit both pinned stacks, the GPU stack differs from the CPU one only where vLLM's metadata
forces it, and constraints/gpu_resolution.py (the make target's checker) accepts the pinned set and names each kind of
drift in a pip report built by hand."""

from __future__ import annotations

import copy
import importlib.metadata as md
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from constraints.gpu_resolution import canon, check, read_pins

ROOT = Path(__file__).resolve().parents[1]
GPU = read_pins(ROOT / "constraints/gpu.txt")
CPU = read_pins(ROOT / "constraints/cpu.txt")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# where the GPU stack may differ from the CPU one, and the requirement (in the resolved metadata) that makes it
FORCED_BY_VLLM = {
    "transformers": "vllm 0.31.0: transformers>=5.10.4,<5.18.0",
    "fastapi": "vllm 0.31.0: fastapi[standard]>=0.133.0,<0.137.0",
    "huggingface-hub": "transformers 5.17.0: huggingface-hub<2.0",
    "numpy": "mistral_common (vllm): numpy<2.4 on Python <= 3.12",
}


def _reqs(texts: list[str]) -> dict[str, Requirement]:
    return {canon(Requirement(t).name): Requirement(t) for t in texts}


def test_vllm_is_pinned_inside_the_installed_trls_vllm_window():
    """trl 1.16's `trl[vllm]` accepts only a window of vLLM versions (read from its installed metadata); the gpu
    extra's pin, the constraints file and TRL's version must agree with it."""
    window = [Requirement(r) for r in md.requires("trl") if Requirement(r).name == "vllm" and "vllm" in str(r)]
    assert window, "trl's metadata has no vllm extra"
    gpu_extra = _reqs(PYPROJECT["optional-dependencies"]["gpu"])
    assert str(gpu_extra["vllm"].specifier) == f"=={GPU['vllm']}"
    assert Version(GPU["vllm"]) in window[0].specifier, (GPU["vllm"], str(window[0].specifier))
    assert GPU["trl"] == CPU["trl"] == md.version("trl")
    assert gpu_extra["trl"].extras == {"vllm"}  # the resolver, not a warning at import, enforces the window


def test_project_ranges_admit_both_pinned_stacks():
    for name, req in _reqs(PYPROJECT["dependencies"]).items():
        for stack, pins in (("cpu", CPU), ("gpu", GPU)):
            assert name in pins, (stack, name)
            assert Version(pins[name]) in req.specifier, (stack, name, pins[name], str(req))
    for name, req in _reqs(PYPROJECT["optional-dependencies"]["gpu"]).items():
        assert Version(GPU[name]) in req.specifier, (name, GPU[name], str(req))


def test_gpu_stack_differs_from_the_cpu_stack_only_where_vllm_forces_it():
    differ = {n for n, v in CPU.items() if Version(GPU.get(n, "0")) != Version(v)}
    assert differ == set(FORCED_BY_VLLM), differ ^ set(FORCED_BY_VLLM)
    assert GPU["torch"] == CPU["torch"] and Version(GPU["triton"]) >= Version("3.7.1")


def _report(pins: dict[str, str]) -> dict:
    """A pip --report resolution of exactly `pins`, with the metadata the checker reads (requires_dist)."""
    requires = {
        "trl": ['vllm<=0.31.0,>=0.22.0; extra == "vllm"', "transformers>=4.56.2"],
        "vllm": ["torch==2.13.0", "transformers<5.18.0,>=5.10.4", 'pytest; extra == "test"'],
        "torch": ['triton==3.7.1; platform_system == "Linux"'],
    }
    items = [{"metadata": {"name": "omni-decision", "version": "0.1.0", "requires_dist": ["trl<1.17,>=1.16"]}}]
    items += [{"metadata": {"name": n, "version": v, "requires_dist": requires.get(n, [])}} for n, v in pins.items()]
    return {"install": items}


def test_resolution_checker_accepts_the_pinned_set():
    problems, versions = check(_report(GPU), GPU)
    assert problems == [] and versions["vllm"] == GPU["vllm"] and len(versions) == len(GPU)


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda p: p.update(openai="3.63.0"), "openai resolved to 3.63.0, pinned"),
        (lambda p: p.update(left_pad="1.0"), "left-pad 1.0 resolved but is not pinned"),
        (lambda p: p.pop("tabulate"), "tabulate==0.10.0 is pinned but nothing requires it"),
        (lambda p: p.update(vllm="0.33.0"), "vllm 0.33.0 is outside trl 1.16.0's vllm window"),
        (lambda p: p.update(torch="2.14.0"), "torch 2.14.0 does not meet vllm's torch==2.13.0"),
        (lambda p: p.update(transformers="5.24.0"), "transformers 5.24.0 does not meet vllm's"),
        (lambda p: p.update(triton="3.6.0"), "triton 3.6.0 < 3.7.1"),
    ],
)
def test_resolution_checker_names_each_kind_of_drift(edit, expected):
    resolved = copy.deepcopy(GPU)
    edit(resolved)
    problems, _ = check(_report({canon(k): v for k, v in resolved.items()}), GPU)
    assert any(expected in p for p in problems), problems


def test_constraints_file_lines_are_strict(tmp_path):
    bad = tmp_path / "c.txt"
    bad.write_text("# comment\ntorch==2.13.0\ntorch>=2\n")
    with pytest.raises(ValueError, match=r"c.txt:3: expected `name==version`"):
        read_pins(bad)
