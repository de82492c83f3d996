"""The project's import graph, read from the source (module level, TYPE_CHECKING blocks and function bodies alike).

    python -m tests.helpers.import_graph      # (make imports) the packages in layers, and any cycle or lazy import

What tests/test_imports.py holds to: no cycle between modules, counting every import; the packages in layers with
pipeline/ on top (it imports collect, sft, rl, rewards, serve; none of them imports it); no function-level import of
the project's own modules (a lazy import can hide a cycle)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("collect", "sft", "rl", "rewards", "serve", "pipeline", "bench")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports() -> list[tuple[str, str, bool]]:
    """(importer, imported module, inside a function) for every import between the project's modules."""
    mods = modules()
    out = []
    for name, p in mods.items():
        tree = ast.parse(p.read_text(encoding="utf-8"))
        nested = {
            id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(f)
        }
        pkg = name if p.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the importer's package
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t in mods and t != name:
                    out.append((name, t, id(node) in nested))
    return sorted(set(out))


def find_cycle(edges) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for a, b, *_ in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> list[str] | None:
        state[u] = 1
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return [*path[path.index(v) :], v]
            if v not in state and (c := visit(v, [*path, v])):
                return c
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (c := visit(u, [u])):
            return c
    return None


def package_edges(edges) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for a, b, *_ in edges:
        pa, pb = a.split(".")[0], b.split(".")[0]
        if pa != pb:
            out[pa].add(pb)
    return out


def main() -> int:
    edges = imports()
    pk = package_edges(edges)
    print("package -> the packages it imports")
    for p in PACKAGES:
        print(f"  {p:9s} -> {', '.join(sorted(pk[p])) or '-'}")
    lazy = [f"{a} -> {b}" for a, b, inner in edges if inner]
    cycle = find_cycle(edges)
    print(f"module imports: {len(edges)}; inside functions: {len(lazy)}" + "".join(f"\n  {x}" for x in lazy))
    print("import cycle: " + (" -> ".join(cycle) if cycle else "none"))
    return 1 if cycle or lazy else 0


if __name__ == "__main__":
    sys.exit(main())
