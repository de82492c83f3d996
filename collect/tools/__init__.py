"""Tools: OpenAI function schemas per R0, and the ToolBox that executes one call and normalizes its observation.

Tool-side failures (unknown asset, unreadable media, provider errors, sandbox crashes) raise `ToolFailure`; the loop
records them as a ToolError event and continues. Results that simply contain nothing useful are normal observations.
"""

from __future__ import annotations

from collect.config import DEFAULT_BLOCKED_DOMAINS, ToolsConfig  # ToolsConfig lives with the other runtime configs
from collect.ledger import PERCEPTION_TOOLS, NormalizedObservation, TaskContext
from collect.tasks import Task
from collect.tools import perception, web
from collect.tools.code_executor import run_code_async

__all__ = ["DEFAULT_BLOCKED_DOMAINS", "FINISH_SCHEMA", "ToolBox", "ToolFailure", "ToolsConfig", "tool_schemas"]


class ToolFailure(Exception):
    """A tool call that failed on the tool side (recorded as a ToolError event, never crashes the loop)."""


_NEED_INDEX = {"type": "integer", "minimum": 0, "description": "index of the evidence need this call targets"}
_PERCEPTION_DESC = {
    "subtitle_grounding": "Find spoken lines / subtitles matching a query, optionally within a time range.",
    "audio_scout": "Find speech, sound events or music matching a query, optionally within a time range.",
    "clip_grounding": "Describe video clips (what happens) matching a query, optionally within a time range.",
    "frame_confirm": "Inspect frames (objects, on-screen text) matching a query, optionally within a time range.",
}


def _function_schema(name: str, description: str, properties: dict, required: list[str]) -> dict:
    """The OpenAI function-tool envelope every tool schema shares (closed objects: no extra arguments)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


# The one finish schema: what the planner is shown (collect.roles.render.tools_for appends it last), what harvested
# rows carry and what rewards validate against. Unlike the tool schemas it is not closed (no additionalProperties):
# this is the schema every recorded trajectory was collected with, so changing it changes the planner's prompt.
FINISH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "finish",
        "description": "Submit a draft answer; the runtime checks the evidence and writes the final answer.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "your draft answer"}},
            "required": ["answer"],
        },
    },
}


def _perception_schema(tool: str, r0: TaskContext) -> dict:
    assets = [a for a in r0.assets if tool in PERCEPTION_TOOLS[a.type]]
    props: dict = {
        "asset_id": {"type": "string", "enum": [a.id for a in assets], "description": "which asset to inspect"},
        "query": {"type": "string", "description": "what to look or listen for"},
    }
    if any(a.type in ("video", "audio") for a in assets):
        # Stays "array" with runtime.window_refs, where a planner may write "{window:K}": vLLM's qwen3_coder parser
        # (0.31) converts a value by this type (array: json.loads, else the raw string, which carries the reference;
        # tests/test_tool_call_symmetry.py parses both forms back; docs/serving.md).
        props["time_range"] = {
            "type": "array",
            "items": {"type": "number", "minimum": 0},
            "minItems": 2,
            "maxItems": 2,
            "description": "[start, end] in seconds",
        }
    props["need_index"] = _NEED_INDEX
    required = (["asset_id"] if len(r0.assets) > 1 else []) + ["query"]
    return _function_schema(tool, _PERCEPTION_DESC[tool], props, required)


def tool_schemas(r0: TaskContext, web: bool = True) -> list[dict]:
    """OpenAI function schemas for R0's action space, in the order of r0.tools() (finish: FINISH_SCHEMA)."""
    out = []
    for t in r0.tools():
        if t in _PERCEPTION_DESC:
            out.append(_perception_schema(t, r0))
        elif t == "web_search" and web:
            out.append(
                _function_schema(
                    "web_search",
                    "Search the web; returns titles, links, snippets and dates.",
                    {"query": {"type": "string", "description": "search query"}, "need_index": _NEED_INDEX},
                    ["query"],
                )
            )
        elif t == "code_executor":
            out.append(
                _function_schema(
                    "code_executor",
                    "Run a self-contained Python program in a sandbox; returns stdout/stderr.",
                    {
                        "code": {"type": "string", "description": "Python source; print the result"},
                        "need_index": _NEED_INDEX,
                    },
                    ["code"],
                )
            )
        elif t == "finish":
            out.append(FINISH_SCHEMA)
    return out


def _time_range(arguments: dict) -> tuple[float, float] | None:
    tr = arguments.get("time_range")
    if tr is None:
        return None
    if not isinstance(tr, (list, tuple)) or len(tr) != 2:
        raise ToolFailure(f"time_range must be [start, end], got {tr!r}")
    try:
        lo, hi = float(tr[0]), float(tr[1])
    except (TypeError, ValueError):
        raise ToolFailure(f"time_range values must be numbers, got {tr!r}") from None
    if lo < 0 or hi < lo:
        raise ToolFailure(f"time_range must satisfy 0 <= start <= end, got {tr!r}")
    return lo, hi


class ToolBox:
    """Executes one tool call for one task. `corpus` is the run's local web corpus for the bm25 backend (the embedded
    world's, or a task source's corpus JSONL); a task's own `documents` are searched together with it."""

    def __init__(
        self, task: Task, r0: TaskContext, config: ToolsConfig | None = None, corpus: list[dict] | None = None
    ):
        self.task, self.r0 = task, r0
        self.config = config or ToolsConfig()
        self.corpus = corpus if corpus is not None else []
        own = getattr(task, "documents", None) or []
        if own:  # a new list (and index) for this task only; the shared corpus stays untouched
            self.corpus = list(self.corpus) + [
                {**d.model_dump(), "id": d.id or f"{task.id}-doc{k}"} for k, d in enumerate(own)
            ]
        self._schemas = tool_schemas(r0)
        self._media = None
        if self.config.perception_backend == "media":
            self._media = perception.MediaPerception.from_tools_config(self.config)

    def take_usage(self) -> dict:
        """Chat usage of the tool calls since the last take, by role ({"perception": Usage}; empty when none)."""
        if self._media is None:
            return {}
        u = self._media.take_usage()
        return {} if u.empty() else {"perception": u}

    def schemas(self) -> list[dict]:
        return self._schemas

    def _cap(self, text: str) -> str:
        n = self.config.max_observation_chars
        return text if len(text) <= n else text[: n - 15] + " ...[truncated]"

    async def execute(self, name: str, arguments: dict) -> tuple[str, NormalizedObservation]:
        if name not in self.r0.tools() or name == "finish":
            raise ToolFailure(f"tool {name!r} is not executable for task {self.task.id}")
        arguments = arguments or {}
        if name in perception.TOOL_TRACK:
            return await self._perceive(name, arguments)
        if name == "web_search":
            return await self._search(arguments)
        return await self._code(arguments)

    # ---- perception ------------------------------------------------------------------------------------------------
    async def _perceive(self, tool: str, arguments: dict) -> tuple[str, NormalizedObservation]:
        query = str(arguments.get("query") or "").strip()
        if not query:
            raise ToolFailure(f"{tool}: query is required")
        aid = arguments.get("asset_id")
        serving = [a for a in self.task.assets if tool in PERCEPTION_TOOLS[a.type]]
        if aid is None:
            if len(serving) != 1:
                raise ToolFailure(f"{tool}: asset_id is required (candidates: {[a.id for a in serving]})")
            asset = serving[0]
        else:
            asset = self.task.asset(str(aid))
            if asset is None:
                raise ToolFailure(f"{tool}: unknown asset_id {aid!r}")
            if tool not in PERCEPTION_TOOLS[asset.type]:
                raise ToolFailure(f"{tool}: not available for {asset.type} asset {asset.id}")
        tr = _time_range(arguments)
        if self._media is not None:
            try:
                text = await self._media.describe(asset, tool, query, tr)
            except perception.PerceptionError as e:
                raise ToolFailure(f"{tool}: {e}") from None
            raw = self._cap(text)
            return raw, NormalizedObservation(
                tool=tool, ok=True, summary=raw, asset_id=asset.id, span=tr, items=(raw,)
            )
        hits = perception.annotation_search(asset, tool, query, tr, self.config.perception_top_k)
        items = tuple(f"[{s:.1f}-{e:.1f}s] {t}" if e > s else f"[{s:.1f}s] {t}" for s, e, t in hits)
        where = f" in {tr[0]:.0f}-{tr[1]:.0f}s" if tr else ""
        if items:
            raw = self._cap(f"{tool} on {asset.id}{where} for {query!r}:\n" + "\n".join(items))
            span = (min(h[0] for h in hits), max(h[1] for h in hits))
        else:
            raw = f"{tool} on {asset.id}{where} for {query!r}: nothing found."
            span = tr
        return raw, NormalizedObservation(tool=tool, ok=True, summary=raw, asset_id=asset.id, span=span, items=items)

    # ---- web ----------------------------------------------------------------------------------------------------
    async def _search(self, arguments: dict) -> tuple[str, NormalizedObservation]:
        query = str(arguments.get("query") or "").strip()
        if not query:
            raise ToolFailure("web_search: query is required")
        c = self.config
        try:
            if c.web_backend == "bm25":
                results = web.bm25_search(self.corpus, query, c.top_k, c.blocked_domains, c.web_stemmer)
            else:
                results = await web.http_search(
                    c.web_provider_url, c.web_api_key_env, query, c.top_k, c.blocked_domains
                )
                for r in results[: c.web_fetch_pages]:
                    try:
                        r["snippet"] += " | page: " + await web.fetch_page(r["link"], c.blocked_domains, 1500)
                    except web.WebError as e:
                        r["snippet"] += f" | page unavailable ({e})"
        except web.WebError as e:
            raise ToolFailure(f"web_search: {e}") from None
        items = tuple(f"{r['title']} ({r['link']}, {r['date']}): {r['snippet']}" for r in results)
        if items:
            raw = self._cap(f"web_search for {query!r}:\n" + "\n".join(f"{i + 1}. {t}" for i, t in enumerate(items)))
        else:
            raw = f"web_search for {query!r}: no results."
        return raw, NormalizedObservation(tool="web_search", ok=True, summary=raw, items=items)

    # ---- code -------------------------------------------------------------------------------------------------------
    async def _code(self, arguments: dict) -> tuple[str, NormalizedObservation]:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            raise ToolFailure("code_executor: code is required")
        c = self.config
        try:
            res = await run_code_async(
                code,
                timeout_s=c.code_timeout_s,
                memory_mb=c.code_memory_mb,
                max_output_chars=c.max_observation_chars,
            )
        except Exception as e:  # noqa: BLE001 - a sandbox crash is a tool-side failure, recorded as ToolError
            raise ToolFailure(f"code_executor: sandbox error {type(e).__name__}: {e}") from None
        status = (
            "timed out" if res.timed_out else (f"killed ({res.killed})" if res.killed else f"exit {res.returncode}")
        )
        raw = self._cap(
            f"code_executor: {status}\nstdout:\n{res.stdout}"
            + (f"\nstderr:\n{res.stderr}" if res.stderr.strip() else "")
        )
        ok = res.returncode == 0 and not res.timed_out and not res.killed
        items = tuple(x for x in res.stdout.splitlines() if x.strip())
        return raw, NormalizedObservation(
            tool="code_executor",
            ok=ok,
            summary=raw,
            items=items,
            error=None if ok else status + (f": {res.stderr[-300:]}" if res.stderr else ""),
        )
