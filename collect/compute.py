"""The small helper library used by compute needs: the world generator evaluates gold values with it, and the
offline teacher's planner pastes the same source into the Python it sends to code_executor (so the code the planner
writes is self-contained and runs in the sandbox)."""

from __future__ import annotations

import ast
import functools

HELPERS_SRC = """
import re
from datetime import datetime


def to_num(s):
    m = re.search(r"-?\\d[\\d,]*(?:\\.\\d+)?", str(s))
    if m is None:
        raise ValueError(f"no number in {s!r}")
    return float(m.group(0).replace(",", ""))


def to_date(s):
    return datetime.strptime(str(s).strip(), "%d %B %Y")


def days_between(a, b):
    return abs((to_date(b) - to_date(a)).days)


def fmt(x):
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    if isinstance(x, float):
        return f"{x:.2f}".rstrip("0").rstrip(".")
    return str(x)
"""


@functools.lru_cache(maxsize=1)
def helper_names() -> frozenset[str]:
    """The names HELPERS_SRC defines at its top level (functions, imports): what a compute formula may use besides
    its values and Python's builtins (collect.tasks checks every formula against them at load)."""
    names = set()
    for node in ast.parse(HELPERS_SRC).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def evaluate(expr: str, values: dict[int, str]) -> str:
    """Evaluate a compute formula (e.g. ``to_num(v2) - to_num(v1)``) over need values -> formatted string."""
    ns: dict = {}
    exec(HELPERS_SRC, ns)  # trusted, generator-side only (the formula comes from our own templates)
    for i, v in values.items():
        ns[f"v{i}"] = v
    return ns["fmt"](eval(expr, ns))


def program(expr: str, values: dict[int, str]) -> str:
    """The self-contained Python program a planner sends to code_executor for a formula."""
    lines = [HELPERS_SRC.strip(), ""]
    for i in sorted(values):
        lines.append(f"v{i} = {values[i]!r}")
    lines.append(f"print(fmt({expr}))")
    return "\n".join(lines) + "\n"
