"""Async OpenAI-compatible chat client: per-call timeout, own retry loop, shared concurrency limit, usage and cost.

`openai.AsyncOpenAI` is created with `max_retries=0`; this module decides what to retry:
  429 (rate_limit)  -> wait max(Retry-After, backoff), retry
  5xx (server_error), timeouts (timeout), connection errors (connection), unparseable bodies (malformed) -> backoff
  other 4xx          -> raise ChatError at once (a configuration problem: wrong model, bad request)
Backoff is base * 2**attempt with +-50% jitter, capped at backoff_max_s. Every fault is counted in Usage.faults.
The API key is read from the environment variable named in the EndpointConfig at client creation; it is never stored
in a config, logged, or put in a trajectory (repr of the client hides it).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass

import openai
from openai.types.chat import ChatCompletion

from collect.config import EndpointConfig
from collect.roles.base import Usage

FAULT_KINDS = ("timeout", "rate_limit", "server_error", "connection", "malformed")


class ChatError(RuntimeError):
    """A chat call that failed for good (non-retryable status, or retries exhausted). `kind` is the last fault."""

    def __init__(self, kind: str, detail: str, usage: Usage):
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


def _retry_after_s(exc: openai.APIStatusError) -> float | None:
    headers = getattr(exc.response, "headers", None) or {}
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    v = headers.get("retry-after")
    if v:
        try:
            return max(0.0, float(v))
        except ValueError:
            return None  # HTTP-date form: fall back to backoff
    return None


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


class ChatClient:
    """One endpoint. `chat()` is safe to call from many tasks; the semaphore bounds calls in flight."""

    def __init__(self, cfg: EndpointConfig, semaphore: asyncio.Semaphore | None = None, *, rng: random.Random = None):
        self.cfg = cfg
        self.semaphore = semaphore or asyncio.Semaphore(8)
        self._rng = rng or random.Random()
        key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
        self._client = openai.AsyncOpenAI(
            base_url=cfg.base_url, api_key=key or "EMPTY", max_retries=0, timeout=cfg.timeout_s
        )

    def __repr__(self) -> str:
        return f"ChatClient(base_url={self.cfg.base_url!r}, model={self.cfg.model!r})"

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * (2**attempt)) * self._rng.uniform(0.5, 1.5)
        return max(delay, retry_after) if retry_after is not None else delay

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
        """One completion, retried on transient faults. Raises ChatError when it cannot get one. `extra_body` fields
        are merged into the request body (e.g. {"chat_template_kwargs": {"enable_thinking": False}})."""
        usage = Usage(model=self.cfg.model)
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
        attempt = 0
        while True:
            t0 = time.monotonic()
            try:
                async with self.semaphore:
                    t0 = time.monotonic()
                    # The client's low-level post: the same HTTP request, auth, timeout and response parsing as
                    # chat.completions.create, without its per-call TypedDict transform of messages and tools
                    # (plain dicts here), which cost ~3 ms of CPU per call and capped concurrency.
                    resp = await asyncio.wait_for(
                        self._client.post(
                            "/chat/completions",
                            cast_to=ChatCompletion,
                            body=kwargs,
                            options={"timeout": self.cfg.timeout_s},
                        ),
                        timeout=self.cfg.timeout_s + 1.0,
                    )
                    if not getattr(resp, "choices", None) or resp.choices[0].message is None:
                        raise _Malformed(f"response without choices: {str(resp)[:200]}")
            except Exception as exc:  # noqa: BLE001 - classified below; unknown kinds re-raise
                usage.latency_s += time.monotonic() - t0
                kind, retry_after = _classify(exc)
                if kind is None:
                    if isinstance(exc, openai.APIStatusError):
                        detail = f"HTTP {exc.status_code} from {self.cfg.base_url}: {exc}"
                        raise ChatError("status", detail, usage) from exc
                    raise
                usage.faults[kind] = usage.faults.get(kind, 0) + 1
                if attempt >= self.cfg.max_retries:
                    raise ChatError(
                        kind, f"{self.cfg.base_url} model={self.cfg.model}: gave up after {attempt + 1} tries", usage
                    ) from exc
                await asyncio.sleep(self._backoff(attempt, retry_after))
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
        usage.prompt_tokens = int(getattr(u, "prompt_tokens", 0) or 0)
        usage.completion_tokens = int(getattr(u, "completion_tokens", 0) or 0)
        usage.calls = 1
        usage.cost_usd = self._cost(usage.prompt_tokens, usage.completion_tokens)
        return ChatResponse(msg.content or "", calls, resp.choices[0].finish_reason, usage)

    async def close(self) -> None:
        await self._client.close()


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
