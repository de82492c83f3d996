"""The roles over an OpenAI-compatible chat endpoint (collect.llm.ChatClient).

Roles send the messages the loop rendered (collect.roles.render) and turn replies into typed values. Model output is
parsed leniently (code fences, prose around JSON, single quotes, trailing commas); what still cannot be read becomes a
conservative value plus a `malformed` fault in Usage:
  need parser   -> one blocking need built from the question
  critic        -> Verdict(INSUFFICIENT, gap_type=CRITIC_ERROR_GAP, no updates); the loop adds ModelError(role=critic)
  answer critic -> PASS/BLOCK read from a bare keyword, else PASS (the finalizer's answer stands)
Transport failures (collect.llm.ChatError) propagate: they are program/infrastructure errors, not model errors.
"""

from __future__ import annotations

import ast
import math
import re

from collect import bounds, jsonio
from collect.ledger import (
    CLOSURE_LEVELS,
    NEED_ROLES,
    NEED_STATUSES,
    SOURCES,
    VERDICTS,
    Ledger,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    TaskContext,
    Verdict,
)
from collect.llm import ChatClient, Usage
from collect.roles.base import PlannerReply

CRITIC_ERROR_GAP = "critic_output_error"  # gap_type of the fallback verdict when the critic's output is unreadable

_MAX_REPLY_CHARS = bounds.Limits().max_reply_chars
_MAX_DEPTH = bounds.Limits().max_json_depth
_FENCE_RE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_TRAILING_COMMA_RE = re.compile(r",\s*([}\]])")


def _balanced_spans(text: str, open_ch: str = "{", close_ch: str = "}") -> list[str]:
    """Top-level balanced {...} substrings, scanning outside of string literals (either quote style)."""
    spans, depth, start, quote, esc = [], 0, -1, None, False
    for i, ch in enumerate(text):
        if quote:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'" and depth > 0:
            quote = ch
        elif ch == open_ch:
            if depth == 0:
                start = i
            depth += 1
        elif ch == close_ch and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def _json_like(v) -> bool:
    """Whether a Python literal is what JSON could have said: dicts with string keys, lists/tuples, strings, bools,
    None, ints and finite floats (no inf from 1e999, no complex, sets or bytes). Iterative."""
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                return False
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
        elif isinstance(x, float):
            if not math.isfinite(x):
                return False
        elif not (x is None or isinstance(x, str | int)):  # bool is an int
            return False
    return True


def _loads_lenient(s: str):
    """JSON, else a Python literal; None when neither reads. Strict about numbers either way (collect.jsonio.loads:
    no NaN/Infinity, no float overflow, no integer past the digit limit), and no failure of either decoder escapes."""
    if bounds.json_depth(s) > _MAX_DEPTH:
        return None  # hostile nesting: unreadable, never a RecursionError
    for candidate in (s, _TRAILING_COMMA_RE.sub(r"\1", s)):
        try:
            return jsonio.loads(candidate)
        except jsonio.BadJSON:
            pass
    py = _TRAILING_COMMA_RE.sub(r"\1", s)
    py = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", py)))
    try:
        v = ast.literal_eval(py)
    except (SyntaxError, MemoryError, *jsonio.DECODE_ERRORS):  # TypeError: an unhashable key, {[0]: 1}
        return None
    return v if _json_like(v) else None


def parse_json_object(text: str | None) -> dict | None:
    """The first JSON object in a model reply, tolerating fences, prose, single quotes and trailing commas."""
    if not text or len(text) > _MAX_REPLY_CHARS:
        return None  # empty, or too long to be a reply worth parsing (bounds.Limits): unreadable
    candidates = [m.strip() for m in _FENCE_RE.findall(text)] + [text.strip()]
    for c in candidates:
        for span in [c] + _balanced_spans(c):
            v = _loads_lenient(span)
            if isinstance(v, dict):
                return v
    return None


def _fault(usage: Usage, kind: str = "malformed") -> None:
    usage.faults[kind] = usage.faults.get(kind, 0) + 1


def _choice(value, allowed: tuple, default: str) -> str:
    v = str(value or "").strip().lower()
    for a in allowed:
        if v == a.lower():
            return a
    return default


def _int_list(v) -> tuple[int, ...]:
    if isinstance(v, int) and not isinstance(v, bool):
        return (v,)
    if isinstance(v, list | tuple):
        return tuple(x for x in v if isinstance(x, int) and not isinstance(x, bool))
    return ()


def parse_needs(text: str, r0: TaskContext) -> list[NeedSpec] | None:
    obj = parse_json_object(text)
    if obj is None:
        spans = _balanced_spans(text or "", "[", "]")
        obj = {"needs": _loads_lenient(spans[0])} if spans else None
    raw = obj.get("needs", obj.get("evidence_needs")) if isinstance(obj, dict) else None
    if not isinstance(raw, list) or not raw:
        return None
    out = []
    for d in raw:
        if not isinstance(d, dict) or not str(d.get("need") or "").strip():
            continue
        out.append(
            NeedSpec(
                need=str(d["need"]).strip(),
                preferred_source=_choice(d.get("preferred_source"), SOURCES, "web"),
                closure_level=_choice(d.get("closure_level"), CLOSURE_LEVELS, "blocking"),
                need_role=_choice(d.get("need_role"), NEED_ROLES, "external_fact"),
                depends_on=_int_list(d.get("depends_on")),
                query_focus=str(d.get("query_focus") or "").strip(),
            )
        )
    return out or None


def parse_verdict(text: str) -> Verdict | None:
    """Critic reply -> Verdict; None when no JSON object can be read. Bad update entries are dropped one by one."""
    obj = parse_json_object(text)
    if obj is None:
        return None
    verdict = _choice(obj.get("verdict"), VERDICTS, "INSUFFICIENT")
    gap = obj.get("gap_diagnosis") if isinstance(obj.get("gap_diagnosis"), dict) else {}
    updates = []
    raw_updates = obj.get("updated_need_statuses")
    for u in raw_updates if isinstance(raw_updates, list) else []:
        if not isinstance(u, dict):
            continue
        try:
            idx = int(u.get("need_index"))
        except (TypeError, ValueError, OverflowError):  # None, "x", a huge string; inf
            continue
        status = _choice(u.get("status"), NEED_STATUSES, "")
        if not status:
            continue
        role = u.get("revised_need_role")
        value = u.get("value")
        updates.append(
            NeedUpdate(
                need_index=idx,
                status=status,
                value=None if value is None else str(value),
                filled_by=str(u["filled_by"]) if u.get("filled_by") else None,
                evidence=str(u.get("evidence") or ""),
                revised_query_focus=str(u["revised_query_focus"]) if u.get("revised_query_focus") else None,
                revised_need_role=_choice(role, NEED_ROLES, "") or None if role else None,
                add_depends_on=_int_list(u.get("add_depends_on")),
            )
        )
    return Verdict(
        verdict=verdict,
        gap_type=str(gap.get("gap_type") or verdict.lower()),
        description=str(gap.get("description") or ""),
        updates=tuple(updates),
    )


class OpenAINeedParser:
    def __init__(self, client: ChatClient):
        self.client = client

    async def parse(self, r0: TaskContext, messages: list[dict]) -> tuple[list[NeedSpec], Usage]:
        resp = await self.client.chat(messages)
        needs = parse_needs(resp.text, r0)
        if needs is None:
            _fault(resp.usage)
            needs = [NeedSpec(need=r0.question, query_focus=r0.question[:200])]
        return needs, resp.usage


class OpenAIPlanner:
    async def decide(
        self,
        messages: list[dict],
        tools: list[dict],
        *,
        r0: TaskContext,
        ledger: Ledger,
    ) -> PlannerReply:
        resp = await self.client.chat(messages, tools=tools)
        return PlannerReply(text=resp.text, tool_calls=resp.tool_calls, usage=resp.usage)

    def __init__(self, client: ChatClient):
        self.client = client


class OpenAICritic:
    def __init__(self, client: ChatClient):
        self.client = client

    async def judge(
        self,
        r0: TaskContext,
        ledger: Ledger,
        tool: str,
        arguments: dict,
        observation: NormalizedObservation,
        messages: list[dict],
    ) -> tuple[Verdict, Usage]:
        resp = await self.client.chat(messages)
        v = parse_verdict(resp.text)
        if v is None:
            _fault(resp.usage)
            v = Verdict("INSUFFICIENT", CRITIC_ERROR_GAP, f"critic output unreadable: {resp.text[:200]!r}")
        return v, resp.usage


class OpenAIFinalizer:
    def __init__(self, client: ChatClient):
        self.client = client

    async def draft(self, r0: TaskContext, ledger: Ledger, messages: list[dict]) -> tuple[str, Usage]:
        resp = await self.client.chat(messages)
        return resp.text.strip(), resp.usage


class OpenAIAnswerCritic:
    def __init__(self, client: ChatClient):
        self.client = client

    async def check(
        self, r0: TaskContext, ledger: Ledger, answer: str, messages: list[dict]
    ) -> tuple[bool, str, Usage]:
        resp = await self.client.chat(messages)
        obj = parse_json_object(resp.text)
        if obj is not None and str(obj.get("verdict", "")).strip().upper() in ("PASS", "BLOCK"):
            return str(obj["verdict"]).strip().upper() == "PASS", str(obj.get("revision_hint") or ""), resp.usage
        _fault(resp.usage)
        blocked = re.search(r"\bBLOCK\b", resp.text or "") is not None
        return not blocked, (resp.text or "")[:200] if blocked else "", resp.usage


class OpenAISummarizer:
    def __init__(self, client: ChatClient):
        self.client = client

    async def summarize(
        self, r0: TaskContext, summary: str, observation: str, max_chars: int, messages: list[dict]
    ) -> tuple[str, Usage]:
        resp = await self.client.chat(messages)
        return resp.text.strip()[:max_chars], resp.usage


_ROLE_CLASSES = {
    "need_parser": OpenAINeedParser,
    "planner": OpenAIPlanner,
    "critic": OpenAICritic,
    "finalizer": OpenAIFinalizer,
    "answer_critic": OpenAIAnswerCritic,
    "summarizer": OpenAISummarizer,
}


def make_openai_role(role: str, client: ChatClient):
    """The OpenAI-backed implementation of one role name (see collect.config.ROLE_NAMES)."""
    if role not in _ROLE_CLASSES:
        raise ValueError(f"unknown role {role!r}; expected one of {sorted(_ROLE_CLASSES)}")
    return _ROLE_CLASSES[role](client)
