"""Async OpenAI-compatible chat client: the one place an `openai.AsyncOpenAI` is built. Roles, the media perception
backend, the OmniGAIA answer judge and the RL reward judge all call through `ChatClient`, so they share one fault
classification, retry and deadline policy, usage and cost accounting, and secret redaction.

`openai.AsyncOpenAI` is created with `max_retries=0`; this module decides what to retry:
  429 (rate_limit)  -> wait max(Retry-After, backoff), retry
  5xx (server_error), timeouts (timeout), connection errors (connection), unparseable bodies (malformed) -> backoff
  other 4xx          -> raise ChatError at once (a configuration problem: wrong model, bad request, bad key)
Backoff is base * 2**attempt with +-50% jitter, capped at backoff_max_s; a Retry-After header is honoured up to the
same cap (inf, nan, negative or unparseable values fall back to the backoff). Every `chat()` has an overall deadline
(`deadline_s`, counted from its first attempt, across attempts and waits); past it the call raises
ChatError("deadline"). Every fault is counted in Usage.faults. Token counts the endpoint reports are validated
(non-negative integers up to MAX_TOKENS_PER_CALL); others are recorded as 0 and counted as a `bad_usage` fault.
The API key is read from the environment variable named in the EndpointConfig at client creation; it is never stored
in a config, logged, or put in a trajectory (repr of the client hides it), and `redact()` strips it (and anything
key-shaped) from every error text this module produces.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Protocol

import openai
from openai.types.chat import ChatCompletion

FAULT_KINDS = ("timeout", "rate_limit", "server_error", "connection", "malformed", "deadline", "bad_usage")
MAX_TOKENS_PER_CALL = 10_000_000  # a token count above this in one response is not believed (bad_usage)
REDACTED = "[REDACTED]"


class EndpointConfig(Protocol):
    """What the client reads of an endpoint: `collect.config.EndpointConfig` (this module imports nothing of collect,
    so config, roles, tools and rewards can all import it without an import cycle)."""

    base_url: str
    model: str
    api_key_env: str | None
    timeout_s: float
    max_retries: int
    temperature: float
    max_tokens: int
    price_in_per_mtok: float
    price_out_per_mtok: float
    backoff_base_s: float
    backoff_max_s: float


# --------------------------------------------------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Usage:
    """Tokens, latency, calls, retries, cost and faults of one or more chat calls (per role in a trajectory)."""

    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    calls: int = 0
    retries: int = 0
    cost_usd: float = 0.0
    faults: dict = field(default_factory=dict)  # fault kind -> count (timeouts, 429, 5xx, malformed, ...)

    def add(self, other: Usage) -> None:
        self.model = self.model or other.model
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.latency_s += other.latency_s
        self.calls += other.calls
        self.retries += other.retries
        self.cost_usd += other.cost_usd
        for k, v in other.faults.items():
            self.faults[k] = self.faults.get(k, 0) + v

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def empty(self) -> bool:
        return not (self.calls or self.retries or self.faults or self.prompt_tokens or self.completion_tokens)

    def to_dict(self) -> dict:
        return asdict(self)


_SCOPES: ContextVar[tuple[Usage, ...]] = ContextVar("chat_usage_scopes", default=())


@contextmanager
def usage_scope() -> Iterator[Usage]:
    """Collect the usage of every `ChatClient.chat()` awaited inside the block (in this task's context), whether the
    call succeeded or raised: `with usage_scope() as u: await judge(...)`."""
    u = Usage()
    token = _SCOPES.set((*_SCOPES.get(), u))
    try:
        yield u
    finally:
        _SCOPES.reset(token)


def add_usage(record: dict, role: str, usage: Usage) -> None:
    """Fold `usage` into a trajectory record's `usage[role]` and `faults` (nothing when the usage is empty)."""
    if usage.empty():
        return
    per_role = record.setdefault("usage", {})
    old = per_role.get(role)
    merged = Usage(**{**old, "faults": dict(old.get("faults") or {})}) if old else Usage()
    merged.add(usage)
    per_role[role] = merged.to_dict()
    faults = record.setdefault("faults", {})
    for k, v in usage.faults.items():
        faults[k] = faults.get(k, 0) + v


def _valid_tokens(value) -> int | None:
    """A reported token count as an int, or None when it is not a plausible one (negative, fractional, huge, text)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= MAX_TOKENS_PER_CALL:
        return None
    return value


# --------------------------------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------------------------------

_KEY_ENVS: set[str] = set()  # env var names that hold endpoint keys (every client registers its own)
_KEYISH_ENV = re.compile(r"(API_?KEY|_KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
_TOKEN = r"[A-Za-z0-9._~+/=\-]"
_KEY_PATTERNS = (
    re.compile(r"\bsk-" + _TOKEN + r"{4,}"),  # OpenAI-style keys: sk-..., sk-proj-...
    re.compile(r"(?i)\b(bearer|basic)\s+" + _TOKEN + r"{4,}"),
    # a long token (with a digit) shortly after "key" / "token" / "secret": `api_key=...`, `key provided: ...`
    re.compile(
        r"(?i)\b(api[_ -]?key|key|token|secret|password)\b([\W]{0,3}[A-Za-z]{0,10}[\W]{1,3})"
        r"(?=" + _TOKEN + r"*\d)" + _TOKEN + r"{16,}"
    ),
)


def register_key_env(name: str | None) -> None:
    """Make `redact` remove the value of env var `name` (endpoint configs name their key's variable)."""
    if name:
        _KEY_ENVS.add(name)


def _known_keys() -> list[str]:
    names = set(_KEY_ENVS) | {n for n in os.environ if _KEYISH_ENV.search(n)}
    vals = {os.environ.get(n) or "" for n in names}
    return sorted((v for v in vals if len(v) >= 6), key=len, reverse=True)


def redact(text: object) -> str:
    """`text` without secrets: the values of the key env vars endpoints name (and of env vars named like keys), and
    key-shaped strings (`sk-...`, `Bearer ...`, a long token after `key`/`token`/`secret`)."""
    s = str(text)
    for v in _known_keys():
        s = s.replace(v, REDACTED)
    s = _KEY_PATTERNS[0].sub(REDACTED, s)
    s = _KEY_PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", s)
    return _KEY_PATTERNS[2].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", s)


# --------------------------------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------------------------------


# How OpenAI, vLLM and serve.local word a 400 for a prompt that does not fit the model's context.
_CONTEXT_MARKERS = ("context_length_exceeded", "maximum context length")


class ChatError(RuntimeError):
    """A chat call that failed for good (non-retryable status, retries exhausted, or past its deadline). `kind` is
    the last fault, "context_length" (a 400 for a prompt over the model's context) or "status"; `detail` is
    redacted; `usage` holds what the failed call cost (retries, faults)."""

    def __init__(self, kind: str, detail: str, usage: Usage):
        detail = redact(detail)
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.usage = usage


@dataclass
class ChatResponse:
    text: str
    tool_calls: list[dict]  # OpenAI shape: {"id", "type": "function", "function": {"name", "arguments": str}}
    finish_reason: str | None
    usage: Usage


def _seconds(v: str | None, scale: float = 1.0) -> float | None:
    """A finite, non-negative number of seconds from a header value, else None (HTTP-date, garbage, inf, nan, < 0)."""
    if not v:
        return None
    try:
        x = float(v) * scale
    except ValueError:
        return None
    return x if math.isfinite(x) and x >= 0 else None


def _retry_after_s(exc: openai.APIStatusError) -> float | None:
    headers = getattr(exc.response, "headers", None) or {}
    ms = _seconds(headers.get("retry-after-ms"), 1e-3)
    return ms if ms is not None else _seconds(headers.get("retry-after"))


def _classify(exc: BaseException) -> tuple[str | None, float | None]:
    """(fault kind or None when not retryable, Retry-After seconds)."""
    if isinstance(exc, asyncio.TimeoutError | openai.APITimeoutError):
        return "timeout", None
    if isinstance(exc, openai.APIConnectionError):
        return "connection", None
    if isinstance(exc, openai.RateLimitError):
        return "rate_limit", _retry_after_s(exc)
    if isinstance(exc, openai.APIStatusError):
        return ("server_error", _retry_after_s(exc)) if exc.status_code >= 500 else (None, None)
    if isinstance(exc, openai.APIResponseValidationError | json.JSONDecodeError | _Malformed):
        return "malformed", None
    return None, None


class _Malformed(Exception):
    """A 200 response without the fields every chat completion has."""


def default_deadline_s(cfg: EndpointConfig) -> float:
    """Overall limit of one chat() when none is configured: every allowed attempt timing out plus every wait at its
    cap, so the default never cuts the configured retries short; it bounds what config and headers can add up to."""
    return cfg.timeout_s * (cfg.max_retries + 1) + max(0.0, cfg.backoff_max_s) * cfg.max_retries + 1.0


class ChatClient:
    """One endpoint. `chat()` is safe to call from many tasks; the semaphore bounds calls in flight.

    `deadline_s` (default: the endpoint config's `deadline_s` if it has one, else `default_deadline_s`) bounds each
    chat() from its first attempt on; time spent waiting for the semaphore is not counted."""

    def __init__(
        self,
        cfg: EndpointConfig,
        semaphore: asyncio.Semaphore | None = None,
        *,
        rng: random.Random | None = None,
        deadline_s: float | None = None,
    ):
        self.cfg = cfg
        self.semaphore = semaphore or asyncio.Semaphore(8)
        self._rng = rng or random.Random()
        self.deadline_s = float(deadline_s or getattr(cfg, "deadline_s", None) or default_deadline_s(cfg))
        if not self.deadline_s > 0:
            raise ValueError(f"ChatClient deadline_s must be > 0, got {self.deadline_s}")
        register_key_env(cfg.api_key_env)
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self._client = openai.AsyncOpenAI(
            base_url=cfg.base_url, api_key=key or "EMPTY", max_retries=0, timeout=cfg.timeout_s
        )

    def __repr__(self) -> str:
        return f"ChatClient(base_url={self.cfg.base_url!r}, model={self.cfg.model!r})"

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cap = max(0.0, self.cfg.backoff_max_s)
        delay = min(cap, self.cfg.backoff_base_s * (2**attempt)) * self._rng.uniform(0.5, 1.5)
        return max(delay, min(retry_after, cap)) if retry_after is not None else delay

    def _cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.cfg.price_in_per_mtok + completion_tokens * self.cfg.price_out_per_mtok) / 1e6

    async def chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: dict | None = None,
    ) -> ChatResponse:
        """One completion, retried on transient faults within the deadline. Raises ChatError when it cannot get one;
        either way the call's usage reaches every enclosing `usage_scope()`. `extra_body` fields are merged into the
        request body (e.g. {"chat_template_kwargs": {"enable_thinking": False}})."""
        usage = Usage(model=self.cfg.model)
        try:
            return await self._chat(usage, messages, tools, temperature, max_tokens, extra_body)
        finally:
            for scope in _SCOPES.get():
                scope.add(usage)

    async def _chat(self, usage, messages, tools, temperature, max_tokens, extra_body=None) -> ChatResponse:
        kwargs = {
            "model": self.cfg.model,
            "messages": messages,
            "temperature": self.cfg.temperature if temperature is None else temperature,
            "max_tokens": max_tokens or self.cfg.max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
        if extra_body:
            kwargs.update(extra_body)
        where = f"{self.cfg.base_url} model={self.cfg.model}"
        deadline: float | None = None
        attempt = 0
        while True:
            t0 = time.monotonic()
            try:
                async with self.semaphore:
                    t0 = time.monotonic()
                    if deadline is None:
                        deadline = t0 + self.deadline_s
                    left = deadline - t0
                    if left <= 0:
                        raise _PastDeadline
                    limit = min(self.cfg.timeout_s, left)
                    # The client's low-level post: the same HTTP request, auth, timeout and response parsing as
                    # chat.completions.create, without its per-call TypedDict transform of messages and tools
                    # (plain dicts here), which cost ~3 ms of CPU per call and capped concurrency.
                    resp = await asyncio.wait_for(
                        self._client.post(
                            "/chat/completions", cast_to=ChatCompletion, body=kwargs, options={"timeout": limit}
                        ),
                        timeout=min(self.cfg.timeout_s + 1.0, left),
                    )
                    if not getattr(resp, "choices", None) or resp.choices[0].message is None:
                        raise _Malformed(f"response without choices: {str(resp)[:200]}")
            except _PastDeadline:
                usage.fault("deadline")
                raise ChatError("deadline", f"{where}: no reply within {self.deadline_s:g}s", usage) from None
            except Exception as exc:  # noqa: BLE001 - classified below; unknown kinds re-raise
                usage.latency_s += time.monotonic() - t0
                kind, retry_after = _classify(exc)
                if kind is None:
                    if isinstance(exc, openai.APIStatusError):
                        # `from None`: the original exception's text may echo the key; only the redacted one travels
                        detail = f"HTTP {exc.status_code} from {self.cfg.base_url}: {exc}"
                        over = exc.status_code == 400 and any(m in str(exc).lower() for m in _CONTEXT_MARKERS)
                        raise ChatError("context_length" if over else "status", detail, usage) from None
                    raise
                usage.fault(kind)
                if attempt >= self.cfg.max_retries:
                    raise ChatError(kind, f"{where}: gave up after {attempt + 1} tries", usage) from None
                wait = self._backoff(attempt, retry_after)
                if time.monotonic() + wait >= deadline:
                    usage.fault("deadline")
                    raise ChatError(
                        "deadline",
                        f"{where}: {kind} after {attempt + 1} tries and the next wait ({wait:.1f}s) passes the "
                        f"{self.deadline_s:g}s deadline",
                        usage,
                    ) from None
                await asyncio.sleep(wait)
                attempt += 1
                usage.retries += 1
                continue
            usage.latency_s += time.monotonic() - t0
            break
        msg = resp.choices[0].message
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in (msg.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        u = resp.usage
        counts = [_valid_tokens(getattr(u, k, None)) for k in ("prompt_tokens", "completion_tokens")]
        if None in counts:  # implausible figures never reach the summary; the call itself is still good
            usage.fault("bad_usage")
        usage.prompt_tokens, usage.completion_tokens = (c or 0 for c in counts)
        usage.calls = 1
        usage.cost_usd = self._cost(usage.prompt_tokens, usage.completion_tokens)
        return ChatResponse(msg.content or "", calls, resp.choices[0].finish_reason, usage)

    async def close(self) -> None:
        await self._client.close()


class _PastDeadline(Exception):
    """Raised inside chat() when an attempt would start after the deadline."""


class ClientPool:
    """One ChatClient per endpoint name, all sharing one concurrency semaphore (create inside the running loop)."""

    def __init__(self, endpoints: dict[str, EndpointConfig], concurrency: int = 8):
        self.endpoints = endpoints
        self.semaphore = asyncio.Semaphore(concurrency)
        self._clients: dict[str, ChatClient] = {}

    def client(self, name: str) -> ChatClient:
        if name not in self.endpoints:
            raise KeyError(f"unknown endpoint {name!r}; configured: {sorted(self.endpoints)}")
        if name not in self._clients:
            self._clients[name] = ChatClient(self.endpoints[name], self.semaphore)
        return self._clients[name]

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
