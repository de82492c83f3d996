"""Async OpenAI-compatible chat client: the one place an `openai.AsyncOpenAI` is built. Roles, the media perception
backend, the OmniGAIA answer judge and the RL reward judge all call through `ChatClient`, so they share one fault
classification, retry and deadline policy, usage and cost accounting, and secret redaction.

`openai.AsyncOpenAI` is created with `max_retries=0`; this module decides what to retry:
  429 (rate_limit)  -> wait max(Retry-After, backoff), retry
  5xx (server_error), timeouts (timeout), connection errors (connection), malformed bodies -> backoff
  other 4xx          -> raise ChatError at once (a configuration problem: wrong model, bad request, bad key)
Backoff is base * 2**attempt with +-50% jitter, capped at backoff_max_s; a Retry-After header is honoured up to the
same cap (inf, nan, negative or unparseable values fall back to the backoff). Every `chat()` has an overall deadline
(`deadline_s`, counted from its first attempt, across attempts and waits); past it the call raises
ChatError("deadline"). A body is malformed when it is not strict JSON (collect.jsonio.loads: NaN/Infinity, a float
overflow, an integer past Python's digit limit, nesting past the recursion limit) or not shaped like a chat completion
(choices, message, tool calls, text content). Every fault is counted in Usage.faults. Token counts the endpoint
reports are validated (non-negative integers up to MAX_TOKENS_PER_CALL); others are recorded as 0 and counted as a
`bad_usage` fault.
The API key is read from the environment variable named in the EndpointConfig at client creation; it is never stored
in a config, logged, or put in a trajectory (repr of the client hides it); the client registers the variable with
collect.jsonio, so `redact()` strips its value (and anything key-shaped) from every error text this module produces,
and every file written through collect.jsonio (trajectories, summaries) has the value removed, model output included.

Transport: a plain `http://` endpoint (no proxy configured for it, no credentials or query in its URL) is called over
this module's own keep-alive HTTP/1.1 connections (`_Http1`): one request = one write of a prebuilt head and the JSON
body, the reply parsed from the socket's bytes (Content-Length, chunked, or up to EOF; gzip, deflate), and no SDK
request or response objects, which cost more CPU per call than the rest of a runtime step. Every other endpoint
(https, proxies) goes through the `openai.AsyncOpenAI` client built here, which is also the fallback when an
`http://` endpoint redirects. Either way the reply is parsed once into plain dicts, and faults are classified the
same: status codes, Retry-After headers and error texts ("Error code: 429 - message") read as the SDK reports them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Protocol

import openai

from collect import jsonio
from collect.jsonio import REDACTED, redact, register_key_env  # noqa: F401 - re-exported: the client's redaction

FAULT_KINDS = ("timeout", "rate_limit", "server_error", "connection", "malformed", "deadline", "bad_usage")
MAX_TOKENS_PER_CALL = 10_000_000  # a token count above this in one response is not believed (bad_usage)


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
        """dataclasses.asdict's dict, without its generic deep copy (faults: a dict of ints)."""
        d = {name: getattr(self, name) for name in _USAGE_FIELDS}
        d["faults"] = dict(self.faults)
        return d


_USAGE_FIELDS = tuple(f.name for f in fields(Usage))

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


def _status_of(exc: BaseException) -> tuple[int, object] | None:
    """(status code, response headers) of an HTTP status fault from either transport, else None."""
    if isinstance(exc, _StatusFault):
        return exc.status_code, exc.headers
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code, getattr(exc.response, "headers", None) or {}
    return None


def _retry_after_s(headers) -> float | None:
    """Retry-After of a reply, in seconds: `retry-after-ms` first, then `retry-after` (headers: case-insensitive
    httpx headers, or the lean transport's dict of lower-cased names)."""
    ms = _seconds(headers.get("retry-after-ms"), 1e-3)
    return ms if ms is not None else _seconds(headers.get("retry-after"))


def _classify(exc: BaseException) -> tuple[str | None, float | None]:
    """(fault kind or None when not retryable, Retry-After seconds)."""
    if isinstance(exc, asyncio.TimeoutError | openai.APITimeoutError):
        return "timeout", None
    if isinstance(exc, openai.APIConnectionError | _ConnectionFault):
        return "connection", None
    status = _status_of(exc)
    if status is not None:
        code, headers = status
        if code == 429:
            return "rate_limit", _retry_after_s(headers)
        return ("server_error", _retry_after_s(headers)) if code >= 500 else (None, None)
    if isinstance(exc, openai.APIResponseValidationError | jsonio.BadJSON | json.JSONDecodeError | UnicodeDecodeError):
        return "malformed", None
    if isinstance(exc, _Malformed):
        return "malformed", None
    return None, None


class _Malformed(Exception):
    """A 200 response without the fields every chat completion has, or with one of the wrong type."""


def _content_text(content) -> str:
    """A message's `content` as text: a string as it is, null as "", a list of content parts as its text parts
    joined (other part types, e.g. "thinking", are skipped). Anything else (a number, an object) is not a chat
    completion's content: `_Malformed` (retried), never a TypeError further down."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        parts = [p.get("text") for p in content if p.get("type") == "text"]
        if all(isinstance(t, str) for t in parts):
            return "".join(parts)
    raise _Malformed(f"message content of type {type(content).__name__}: {str(content)[:200]}")


def _reply_fields(data) -> tuple[object, list[dict], object, dict]:
    """(content, tool calls in OpenAI shape, finish_reason, usage dict) of a parsed chat completion. Read as the SDK's
    unvalidated models read it (absent fields are None; tool calls without a `function`, e.g. custom tool calls, are
    skipped; odd scalar types pass through), except that a structurally broken reply (choices, a choice, the message,
    the tool-call list or a function that is not an object, content that is not text) is `_Malformed` (retried)
    rather than an AttributeError or a TypeError."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices:
        raise _Malformed(f"response without choices: {str(data)[:200]}")
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _Malformed(f"choices is not a list of objects: {str(choices)[:200]}")
    choice = choices[0]
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise _Malformed(f"choice without a message object: {str(choice)[:200]}")
    raw_calls = msg.get("tool_calls") or []
    if isinstance(raw_calls, str | dict):  # the SDK iterates these to nothing (items without a function)
        raw_calls = []
    if not isinstance(raw_calls, list):
        raise _Malformed(f"tool_calls is not a list: {str(raw_calls)[:200]}")
    calls = []
    for c in raw_calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if fn is None:
            continue
        if not isinstance(fn, dict):
            raise _Malformed(f"tool call function is not an object: {str(fn)[:200]}")
        function = {"name": fn.get("name"), "arguments": fn.get("arguments")}
        calls.append({"id": c.get("id"), "type": "function", "function": function})
    usage = data.get("usage")
    text = _content_text(msg.get("content"))
    return text, calls, choice.get("finish_reason"), usage if isinstance(usage, dict) else {}


def _dumps(body: dict) -> bytes:
    """The request body as the SDK encodes it (httpx's JSON defaults)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


# --------------------------------------------------------------------------------------------------------------------
# Lean HTTP/1.1 transport (plain http:// endpoints)
# --------------------------------------------------------------------------------------------------------------------

_MAX_HEAD = 64 * 1024  # a response head (status line + headers) or chunk-size line longer than this is not HTTP
_MAX_BODY = 64 * 1024 * 1024  # a reply body (read or decompressed) above this is refused: no chat reply is that large
_MAX_IDLE = 1000  # idle keep-alive connections kept per endpoint (in-flight ones are bounded by the semaphore)


class _ConnectionFault(Exception):
    """The connection failed, or the reply could not be read as HTTP/1.x (refused, reset, closed before the end of
    the reply, bad framing): what httpx reports as a connect/protocol error (fault "connection")."""


class _StatusFault(Exception):
    """A non-2xx reply on the lean transport, worded as the SDK words it: "Error code: N" and " - message" when the
    body is JSON with an error message (`{"error": {"message": ...}}` or `{"message": ...}`)."""

    def __init__(self, status_code: int, headers: dict, body: bytes):
        self.status_code = status_code
        self.headers = headers
        msg = f"Error code: {status_code}"
        try:
            parsed = jsonio.loads(body.decode("utf-8", "replace").strip())
        except jsonio.BadJSON:  # any body: the status code is what counts
            parsed = None
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        if isinstance(message, str) and message:
            msg += f" - {message}"
        super().__init__(msg)


class _Redirect(Exception):
    """A 3xx reply: the SDK client (which follows redirects) takes over this endpoint."""


class _Connection(asyncio.Protocol):
    """One TCP connection: the bytes received and not yet consumed, whether the peer closed, and one waiter."""

    def __init__(self):
        self.buf = bytearray()
        self.closed = False
        self.transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._wake()

    def eof_received(self) -> None:
        self.closed = True
        self._wake()  # returning None: the transport closes itself

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def more(self) -> None:
        """Wait for more bytes; _ConnectionFault when the peer has closed (the reply is cut short)."""
        if self.closed:
            raise _ConnectionFault("the server closed the connection before the end of the reply")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def reusable(self) -> bool:
        """Open, and nothing unread: the same test httpcore makes before it reuses a connection (a socket that is
        readable while idle was closed by the server or sent something unasked)."""
        return not self.closed and not self.buf and not self.transport.is_closing()

    async def line(self) -> bytes:
        """The next CRLF-terminated line (without the CRLF), consumed."""
        while (i := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > _MAX_HEAD:
                raise _ConnectionFault("a chunk-size line longer than 64 KiB")
            await self.more()
        out = bytes(self.buf[:i])
        del self.buf[: i + 2]
        return out

    async def take(self, n: int) -> bytes:
        if n > _MAX_BODY:
            raise _ConnectionFault(f"a reply body of {n} bytes (more than {_MAX_BODY})")
        while len(self.buf) < n:
            await self.more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def until_closed(self) -> bytes:
        while not self.closed:
            if len(self.buf) > _MAX_BODY:
                raise _ConnectionFault(f"a reply body of more than {_MAX_BODY} bytes")
            await self.more_or_eof()
        out = bytes(self.buf)
        self.buf.clear()
        return out

    async def more_or_eof(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


async def _read_head(c: _Connection) -> tuple[str, int, dict]:
    """(HTTP version, status, headers with lower-cased names; repeated headers joined by ", ") of the next reply."""
    while (end := c.buf.find(b"\r\n\r\n")) < 0:
        if len(c.buf) > _MAX_HEAD:
            raise _ConnectionFault("a response head longer than 64 KiB")
        await c.more()
    lines = bytes(c.buf[:end]).decode("latin-1").split("\r\n")
    del c.buf[: end + 4]
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise _ConnectionFault(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _ConnectionFault(f"bad header line: {line[:80]!r}")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return version, int(code), headers


async def _read_reply(c: _Connection) -> tuple[int, dict, bytes, bool]:
    """(status, headers, decoded body, whether the connection can carry another request) of one reply."""
    version, status, headers = await _read_head(c)
    while 100 <= status < 200:  # interim replies (100 Continue, 103 Early Hints): the real one follows
        version, status, headers = await _read_head(c)
    conn = headers.get("connection", "").lower()
    keep = "close" not in conn if version == "HTTP/1.1" else "keep-alive" in conn
    te = headers.get("transfer-encoding", "").lower()
    if status in (204, 304):
        body = b""
    elif te:
        if te.rsplit(",", 1)[-1].strip() != "chunked":
            raise _ConnectionFault(f"unsupported transfer-encoding {te!r}")
        parts = []
        while True:
            size_line = (await c.line()).split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise _ConnectionFault(f"bad chunk size {size_line[:40]!r}") from None
            if size == 0:
                while await c.line():  # trailers, up to the empty line
                    pass
                break
            parts.append(await c.take(size))
            if sum(map(len, parts)) > _MAX_BODY:
                raise _ConnectionFault(f"a chunked reply body of more than {_MAX_BODY} bytes")
            if await c.take(2) != b"\r\n":
                raise _ConnectionFault("a chunk not followed by CRLF")
        body = b"".join(parts)
    elif "content-length" in headers:
        length = headers["content-length"].split(",")[0].strip()
        if not length.isdigit():
            raise _ConnectionFault(f"bad content-length {length[:40]!r}")
        body = await c.take(int(length))
    else:  # neither: the body ends when the server closes the connection
        body = await c.until_closed()
        keep = False
    enc = headers.get("content-encoding", "").strip().lower()
    if enc in ("gzip", "x-gzip", "deflate"):
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS if enc != "deflate" else zlib.MAX_WBITS)
            body = d.decompress(body, _MAX_BODY + 1)
        except zlib.error:
            raise _ConnectionFault(f"a {enc} body that does not decompress") from None
        if len(body) > _MAX_BODY:  # a small compressed body that expands without bound
            raise _ConnectionFault(f"a {enc} body that decompresses to more than {_MAX_BODY} bytes")
    elif enc not in ("", "identity"):
        raise _ConnectionFault(f"unsupported content-encoding {enc!r}")
    return status, headers, body, keep


class _Http1:
    """POSTs of JSON to one `http://` URL over keep-alive HTTP/1.1 connections: an idle connection is reused when
    it is still open and has nothing unread (else closed), a new one is opened when none is idle; a connection goes
    back to the idle list only after a complete reply that allows keep-alive (a timeout or cancellation mid-reply
    closes it). Bounded in time by the caller (`asyncio.timeout`)."""

    def __init__(self, url: urllib.parse.SplitResult, headers: dict[str, str]):
        self.host, self.port = url.hostname, url.port or 80
        path = url.path if url.path.endswith("/") else url.path + "/"  # as the SDK joins base_url and the route
        head = [f"POST {path}chat/completions HTTP/1.1", f"Host: {url.netloc}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        self._head = ("\r\n".join(head) + "\r\nContent-Length: ").encode("ascii")
        self._idle: list[_Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.opened = 0  # connections opened so far (tests: keep-alive reuse)

    def __repr__(self) -> str:  # the head holds the Authorization header
        return f"_Http1({self.host}:{self.port})"

    async def post(self, body: bytes) -> tuple[int, dict, bytes]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._drop_idle()
            self._loop = loop
        conn = None
        while self._idle:
            c = self._idle.pop()
            if c.reusable():
                conn = c
                break
            c.transport.close()
        if conn is None:
            try:
                _, conn = await loop.create_connection(_Connection, self.host, self.port)
            except OSError as e:
                raise _ConnectionFault(f"cannot connect to {self.host}:{self.port}: {e}") from None
            self.opened += 1
        keep = False
        try:
            conn.transport.write(self._head + b"%d\r\n\r\n" % len(body) + body)
            status, headers, data, keep = await _read_reply(conn)
            return status, headers, data
        finally:
            if keep and conn.reusable() and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
            else:
                conn.transport.close()

    def _drop_idle(self) -> None:
        for c in self._idle:
            try:
                c.transport.close()
            except RuntimeError:  # its loop is closed: the socket goes with the transport
                pass
        self._idle.clear()

    async def close(self) -> None:
        self._drop_idle()
        await asyncio.sleep(0)  # let the transports' connection_lost callbacks close the sockets


def _lean_url(base_url: str) -> urllib.parse.SplitResult | None:
    """The split URL when the lean transport can serve it: plain http, a host, no credentials, query or fragment,
    and no proxy that httpx would use for it (HTTP_PROXY / ALL_PROXY unless NO_PROXY exempts the host)."""
    try:
        url = urllib.parse.urlsplit(base_url)
        url.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None
    if url.scheme.lower() != "http" or not url.hostname or url.username or url.password or url.query or url.fragment:
        return None
    proxies = urllib.request.getproxies_environment()
    if (proxies.get("http") or proxies.get("all")) and not urllib.request.proxy_bypass_environment(url.hostname):
        return None
    return url


def default_deadline_s(cfg: EndpointConfig) -> float:
    """Overall limit of one chat() when none is configured: every allowed attempt timing out plus every wait at its
    cap, so the default never cuts the configured retries short; it bounds what config and headers can add up to."""
    return cfg.timeout_s * (cfg.max_retries + 1) + max(0.0, cfg.backoff_max_s) * cfg.max_retries + 1.0


class ChatClient:
    """One endpoint. `chat()` is safe to call from many tasks; the semaphore bounds calls in flight.

    `deadline_s` (default: the endpoint config's `deadline_s` if it has one, else `default_deadline_s`) bounds each
    chat() from its first attempt on; time spent waiting for the semaphore is not counted. `transport`: "auto" (the
    lean HTTP/1.1 transport for plain http:// endpoints, the SDK client otherwise) or "sdk" (the SDK client always)."""

    def __init__(
        self,
        cfg: EndpointConfig,
        semaphore: asyncio.Semaphore | None = None,
        *,
        rng: random.Random | None = None,
        deadline_s: float | None = None,
        transport: str = "auto",
    ):
        if transport not in ("auto", "sdk"):
            raise ValueError(f"ChatClient transport must be 'auto' or 'sdk', got {transport!r}")
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
        # plain http:// endpoints: this module's keep-alive HTTP/1.1 connections, with the SDK's own request headers
        # (`transport="sdk"` keeps every call on the SDK client)
        url = _lean_url(cfg.base_url) if transport == "auto" else None
        self._http: _Http1 | None = None
        if url is not None:
            headers = {
                "Accept": "application/json",
                "Content-Type": "application/json",
                "User-Agent": self._client.user_agent,
                "Authorization": f"Bearer {key or 'EMPTY'}",
            }
            try:
                self._http = _Http1(url, headers)
            except UnicodeEncodeError:  # a header httpx would refuse too; let the SDK report it
                self._http = None

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
                    data = await self._post(kwargs, limit, left)
                    text, calls, finish_reason, u = _reply_fields(data)
            except _PastDeadline:
                usage.fault("deadline")
                raise ChatError("deadline", f"{where}: no reply within {self.deadline_s:g}s", usage) from None
            except Exception as exc:  # noqa: BLE001 - classified below; unknown kinds re-raise
                usage.latency_s += time.monotonic() - t0
                kind, retry_after = _classify(exc)
                if kind is None:
                    status = _status_of(exc)
                    if status is not None:
                        # `from None`: the original exception's text may echo the key; only the redacted one travels
                        detail = f"HTTP {status[0]} from {self.cfg.base_url}: {exc}"
                        over = status[0] == 400 and any(m in str(exc).lower() for m in _CONTEXT_MARKERS)
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
        counts = [_valid_tokens(u.get(k)) for k in ("prompt_tokens", "completion_tokens")]
        if None in counts:  # implausible figures never reach the summary; the call itself is still good
            usage.fault("bad_usage")
        usage.prompt_tokens, usage.completion_tokens = (c or 0 for c in counts)
        usage.calls = 1
        usage.cost_usd = self._cost(usage.prompt_tokens, usage.completion_tokens)
        return ChatResponse(text, calls, finish_reason, usage)

    async def _post(self, body: dict, limit: float, left: float):
        """One POST /chat/completions, its reply parsed from JSON (plain dicts and lists). Non-2xx replies raise
        (`_StatusFault` here, openai.APIStatusError from the SDK), as do timeouts and connection faults."""
        if self._http is not None:
            try:
                async with asyncio.timeout(limit):
                    status, headers, raw = await self._http.post(_dumps(body))
                if 300 <= status < 400:
                    raise _Redirect
            except _Redirect:  # the SDK client follows redirects; it serves this endpoint from now on
                http, self._http = self._http, None
                await http.close()
            else:
                if not 200 <= status < 300:
                    raise _StatusFault(status, headers, raw)
                return jsonio.loads(raw)
        # The client's low-level post: the same HTTP request, auth, timeout and status handling as
        # chat.completions.create, without its per-call TypedDict transform of messages and tools (plain dicts here)
        # or its pydantic response models (the body comes back as bytes and is parsed once).
        raw = await asyncio.wait_for(
            self._client.post("/chat/completions", cast_to=bytes, body=body, options={"timeout": limit}),
            timeout=min(self.cfg.timeout_s + 1.0, left),
        )
        return jsonio.loads(raw)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
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
