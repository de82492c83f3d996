"""Untrusted output at the boundary: every model, critic and tool text is decoded safely and bounded before the runtime
keeps it.

Model replies are data from a system the runtime does not control: they can carry lone surrogates (which cannot be
encoded as UTF-8 and would break the trajectory append, `canonical_args` and `state_hash`), JSON nested deep enough to
overflow the parser's recursion, or megabytes of text that would be copied into every later prompt and trajectory
line. The loop passes each role's output through this module once; after that the ledger, prompts and files only
ever hold valid, bounded text. Limits are `Limits` (runtime config `limits:`), with defaults generous enough that no
well-behaved reply is touched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from collect import jsonio

_SURROGATE_RE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Limits:
    max_reply_chars: int = field(
        default=32_000, metadata={"help": "longest role reply (text or tool-call arguments) the runtime reads"}
    )
    max_value_chars: int = field(
        default=1_000, metadata={"help": "longest critic value, evidence, focus, entity or need text kept"}
    )
    max_updates: int = field(default=64, metadata={"help": "need updates kept from one critic verdict"})
    max_needs: int = field(default=32, metadata={"help": "needs kept from one need-parser reply"})
    max_json_depth: int = field(default=32, metadata={"help": "deepest JSON nesting accepted in a reply"})

    def __post_init__(self):
        for name in ("max_reply_chars", "max_value_chars", "max_updates", "max_needs", "max_json_depth"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"limits.{name} must be a positive integer, got {v!r}")


class TooDeep(ValueError):
    """JSON text (or a decoded object) nested deeper than the limit."""


def clean_text(s: Any, limit: int | None = None) -> str:
    """`s` as a str that encodes as UTF-8 (lone surrogates -> U+FFFD), cut to `limit` characters with a marker."""
    if not isinstance(s, str):
        s = "" if s is None else str(s)
    if _SURROGATE_RE.search(s):
        s = _SURROGATE_RE.sub("\ufffd", s)
    return s if limit is None else truncate(s, limit)


def truncate(text: str, limit: int) -> str:
    """Cut to `limit` characters and say how much was cut (deterministic; the planner prompts rely on its bytes)."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n...[truncated {len(text) - limit} characters]"


def json_depth(text: str) -> int:
    """Deepest bracket nesting of JSON-ish text, outside string literals (iterative: no recursion on hostile input)."""
    depth = deepest = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def loads(text: str, max_depth: int):
    """Strict JSON (collect.jsonio.loads: BadJSON for NaN/Infinity, float overflow, an integer past the digit limit,
    bad syntax) that refuses nesting deeper than `max_depth` (TooDeep) before it is parsed."""
    if json_depth(text) > max_depth:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels")
    return jsonio.loads(text)


def clean_json(obj: Any, max_depth: int, max_str: int | None = None) -> Any:
    """A copy of a decoded JSON value with every string cleaned (and cut to `max_str`); TooDeep past `max_depth`.
    Iterative, so a hostile object cannot overflow the stack either."""
    root: list = [None]
    stack: list[tuple[Any, Any, Any, int]] = [(obj, root, 0, 0)]  # (value, parent container, key, depth)
    while stack:
        v, parent, key, depth = stack.pop()
        if depth > max_depth:
            raise TooDeep(f"value nested deeper than {max_depth} levels")
        if isinstance(v, str):
            parent[key] = clean_text(v, max_str)
        elif isinstance(v, dict):
            out: dict = {}
            parent[key] = out
            for k, x in v.items():
                ck = clean_text(k, max_str)
                out[ck] = None
                stack.append((x, out, ck, depth + 1))
        elif isinstance(v, list | tuple):
            lst = [None] * len(v)
            parent[key] = lst
            for i, x in enumerate(v):
                stack.append((x, lst, i, depth + 1))
        else:
            parent[key] = v
    return root[0]


def clean_tool_calls(tool_calls: Any, limits: Limits) -> list:
    """Native tool calls from an endpoint: kept as plain dicts/lists with cleaned, bounded strings. A call list that
    nests too deep becomes one unparseable marker call (the planner step is then a model error)."""
    if not tool_calls:
        return []
    try:
        out = clean_json(list(tool_calls), limits.max_json_depth, limits.max_reply_chars)
    except TooDeep:
        return [{"function": {"name": "", "arguments": "(tool calls nested too deep)"}}]
    except TypeError:
        return [{"function": {"name": "", "arguments": "(tool calls of an unknown type)"}}]
    return out


def clean_verdict(verdict, limits: Limits):
    """A critic verdict with bounded text fields and at most `max_updates` updates (the rest are dropped)."""
    n = limits.max_value_chars

    def opt(x):
        return None if x is None else clean_text(x, n)

    ups = tuple(
        replace(
            u,
            value=opt(u.value),
            filled_by=opt(u.filled_by),
            evidence=clean_text(u.evidence, n),
            revised_query_focus=opt(u.revised_query_focus),
            revised_need_role=opt(u.revised_need_role),
            entity=opt(u.entity),
        )
        for u in verdict.updates[: limits.max_updates]
    )
    return replace(
        verdict,
        gap_type=clean_text(verdict.gap_type, n),
        description=clean_text(verdict.description, n),
        updates=ups,
    )


def clean_needs(specs, limits: Limits) -> list:
    """Need-parser output: at most `max_needs` needs with bounded text."""
    n = limits.max_value_chars
    return [
        replace(s, need=clean_text(s.need, n), query_focus=clean_text(s.query_focus, n))
        for s in list(specs)[: limits.max_needs]
    ]


def scrub_record(obj: Any) -> Any:
    """Last line of defence before a file write: every string of a JSON-able record made UTF-8-encodable."""
    return clean_json(obj, max_depth=10_000)


def clean_observation(obs, limits: Limits):
    """A tool's normalized observation with bounded, UTF-8-safe text (tools echo model-written queries)."""
    n = limits.max_reply_chars
    return replace(
        obs,
        summary=clean_text(obs.summary, n),
        items=tuple(clean_text(i, n) for i in obs.items),
        error=None if obs.error is None else clean_text(obs.error, limits.max_value_chars),
    )


def text_size(obj: Any) -> int:
    """Total characters of every string in a JSON-like value (iterative; for size checks before parsing)."""
    total, stack = 0, [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return total
