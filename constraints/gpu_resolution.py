"""Check a pip resolution report (`pip install --dry-run --report`) of `.[test,gpu]` against constraints/gpu.txt.

    python -m constraints.gpu_resolution REPORT.json [constraints/gpu.txt]      (what `make gpu-resolve` runs)

The report is what pip resolved from PyPI's metadata alone (no CUDA, nothing installed). It passes when every
package pip would install is pinned in the constraints file at the version it resolved, every pin was used (no stale
line), and the cross-package rules the GPU stack depends on hold in the resolved metadata itself:
- vLLM is inside the window of trl's `vllm` extra (trl[vllm]);
- torch is the version vLLM pins, and transformers is inside vLLM's range;
- triton is >= 3.7.1 (flash-linear-attention's gated backward refuses 3.4.0 <= triton < 3.7.1 on Hopper).
It prints the key versions with the requirements that chose them. Standard library + `packaging` only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PROJECT = "omni-decision"
KEY = ("vllm", "torch", "triton", "transformers", "trl", "deepspeed", "flash-linear-attention", "fla-core")
KEY += ("tensorboard", "fastapi", "huggingface-hub", "numpy")
HOPPER_TRITON = Version("3.7.1")


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: str | Path) -> dict[str, str]:
    """name -> version of every `name==version` line (comments and blank lines skipped); other lines are errors."""
    pins: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not m:
            raise ValueError(f"{path}:{n}: expected `name==version`, got {line!r}")
        if canon(m[1]) in pins:
            raise ValueError(f"{path}:{n}: {m[1]} is pinned twice")
        pins[canon(m[1])] = m[2]
    return pins


def resolved(report: dict, project: bool = False) -> dict[str, dict]:
    """name -> the report's metadata of each package pip would install (the project itself only with `project`)."""
    out = {}
    for item in report.get("install", []):
        meta = item["metadata"]
        if project or canon(meta["name"]) != PROJECT:
            out[canon(meta["name"])] = meta
    return out


def requirements_on(metas: dict[str, dict], target: str, extra: str | None = None, of: str | None = None):
    """(package, requirement) for every requirement on `target` among the resolved packages' metadata (or only
    `of`'s); with `extra`, requirements under that extra only, else those without an extra marker."""
    for name, meta in metas.items():
        if of is not None and name != canon(of):
            continue
        for text in meta.get("requires_dist") or []:
            req = Requirement(text)
            if canon(req.name) != target:
                continue
            marker = str(req.marker or "")
            if (extra is None) == ("extra ==" in marker):
                continue
            if extra is not None and f'extra == "{extra}"' not in marker:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": extra or "", "python_version": "3.11"}):
                continue
            yield name, req


def check(report: dict, pins: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """(problems, {name: version resolved}). No problems = the report is the pinned set and the rules hold."""
    metas = resolved(report)
    versions = {n: m["version"] for n, m in metas.items()}
    problems = []
    for name, v in sorted(versions.items()):
        if name not in pins:
            problems.append(f"{name} {v} resolved but is not pinned in the constraints file")
        elif Version(pins[name]) != Version(v):
            problems.append(f"{name} resolved to {v}, pinned {pins[name]}")
    stale = [f"{n}=={v}" for n, v in pins.items() if n not in versions]
    problems += [f"{p} is pinned but nothing requires it (stale pin)" for p in stale]
    missing = [k for k in ("vllm", "torch", "transformers", "trl", "triton") if k not in versions]
    if missing:
        return problems + [f"not in the resolution: {missing}"], versions
    window = SpecifierSet()
    for _, req in requirements_on(metas, "vllm", extra="vllm", of="trl"):
        window &= req.specifier
    if not str(window):
        problems.append("trl's metadata has no `vllm` extra requirement on vllm (is trl[vllm] in the gpu extra?)")
    elif Version(versions["vllm"]) not in window:
        problems.append(f"vllm {versions['vllm']} is outside trl {versions['trl']}'s vllm window {window}")
    for target in ("torch", "transformers"):
        for _, req in requirements_on(metas, target, of="vllm"):
            if Version(versions[target]) not in req.specifier:
                problems.append(f"{target} {versions[target]} does not meet vllm's {req}")
    if Version(versions["triton"]) < HOPPER_TRITON:
        problems.append(f"triton {versions['triton']} < {HOPPER_TRITON}: fla's gated backward refuses it on Hopper")
    return problems, versions


def why(report: dict, name: str) -> list[str]:
    """The requirements on `name` in the resolved metadata (what chose its version), e.g. 'vllm: torch==2.13.0'."""
    metas = resolved(report, project=True)
    out = [f"{pkg}: {req}" for pkg, req in requirements_on(metas, name) if str(req.specifier)]
    out += [f"{pkg}[vllm]: {req}" for pkg, req in requirements_on(metas, name, extra="vllm") if str(req.specifier)]
    out += [f"{pkg}[gpu]: {req}" for pkg, req in requirements_on(metas, name, extra="gpu", of=PROJECT)]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print("usage: python -m constraints.gpu_resolution REPORT.json [constraints/gpu.txt]", file=sys.stderr)
        return 2
    report = json.loads(Path(argv[0]).read_text())
    pins_path = argv[1] if len(argv) > 1 else "constraints/gpu.txt"
    problems, versions = check(report, read_pins(pins_path))
    print(f"resolved {len(versions)} packages for .[test,gpu] (Linux x86-64, Python {sys.version.split()[0]}):")
    for k in KEY:
        reasons = "; ".join(why(report, k)) or "-"
        print(f"  {k} {versions.get(k, 'NOT RESOLVED')}  <- {reasons[:400]}")
    for p in problems:
        print(f"  PROBLEM: {p}")
    print(f"{pins_path}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
