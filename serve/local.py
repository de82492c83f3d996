"""A small OpenAI-compatible chat server around a transformers checkpoint (CPU tests, the CPU demo, tiny models).

    python -m serve.local --model runs/sft/tiny/merged --port 8011 [--host 127.0.0.1] [--name tiny] [limits]
    python -m serve.local --config configs/serve/tiny_local.yaml

Endpoints: POST /v1/chat/completions (messages + tools -> chat template -> generate -> `<tool_call>` blocks parsed into
message.tool_calls), GET /v1/models, GET /health. One model, one generation at a time: generations run one by one on a
single worker thread; the collect stage's concurrency waits in a bounded queue. GPU serving of real models is
serve/vllm.py.

Limits (ServeLimits, CLI flags, YAML keys; docs/serving.md): request bodies over `max_body_bytes` -> 413; more than
`max_queue` requests waiting -> 429 + Retry-After; prompt + max_tokens over the model's context
(config.max_position_embeddings) or max_tokens over `max_tokens_limit` -> 400 (as OpenAI, nothing is clamped); a
generation stops after `max_generation_s` (finish_reason "length"), when its client disconnects, or on shutdown
(SIGTERM: the request gets 503 and the process exits). Every malformed field is a 400 with an OpenAI-style error body.
/health and /v1/models are answered on the event loop, never behind a generation.

Slow clients (docs/serving.md, "Slow clients"): a request's headers must arrive within `header_timeout_s` of the
connection (or of the previous response) and its body within `body_timeout_s` of the headers, else 408 and the
connection is closed; at most `max_connections` connections are open (a new one closes the oldest idle one, or gets
503 when every one carries a request), sized below the open-file limit at start; warnings are rate-limited per kind.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import http
import json
import logging
import math
import os
import re
import resource
import socket
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h11
import httpx
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList
from uvicorn.protocols.http.h11_impl import H11Protocol

from collect.actions import TOOL_CALL_RE
from collect.cli import run_cli
from collect.config import ConfigError, from_mapping, load_recipe
from serve.checks import checkpoint_problem, port_problem

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 640
FALLBACK_MAX_TOKENS = 4096  # max_tokens cap when the config names no context length
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_SEQUENCES = 4
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.manual_seed accepts
DISCONNECT_POLL_S = 0.2


@dataclasses.dataclass(frozen=True)
class ServeLimits:
    """Resource limits of one serve.local process (docs/serving.md, "Limits")."""

    max_body_bytes: int = 2 * 1024 * 1024  # larger request bodies -> 413
    max_queue: int = 32  # requests waiting behind the running generation; more -> 429 + Retry-After
    max_generation_s: float = 300.0  # wall-clock limit of one generation; hit -> finish_reason "length"
    max_tokens_limit: int | None = None  # largest max_tokens accepted; None: the model's context length
    context_length: int | None = None  # None: config.max_position_embeddings
    header_timeout_s: float = 10.0  # a request's headers must be complete this long after the connection is idle
    body_timeout_s: float = 30.0  # its body this long after the headers (2 MiB at ~70 KB/s); else 408 + close
    max_connections: int = 256  # open connections; more: the oldest idle one is closed, or 503 if none is idle

    def __post_init__(self):
        for name in ("max_body_bytes", "max_generation_s", "max_tokens_limit", "context_length", "header_timeout_s",
                     "body_timeout_s"):  # fmt: skip
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf):
                raise ValueError(f"ServeLimits.{name} must be > 0, got {v!r}")
        if isinstance(self.max_queue, bool) or not isinstance(self.max_queue, int) or self.max_queue < 0:
            raise ValueError(f"ServeLimits.max_queue must be an integer >= 0, got {self.max_queue!r}")
        n = self.max_connections
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"ServeLimits.max_connections must be an integer >= 1, got {n!r}")


_ERROR_TYPES = {429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class ApiError(Exception):
    """An HTTP error answered with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        err = {
            "message": self.message,
            "type": _ERROR_TYPES.get(self.status, "invalid_request_error"),
            "param": self.param,
            "code": self.code,
        }
        return JSONResponse({"error": err}, status_code=self.status, headers=self.headers)


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclasses.dataclass
class ChatParams:
    """A validated /v1/chat/completions request."""

    messages: list[dict]
    tools: list[dict] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] = dataclasses.field(default_factory=list)
    model: str | None = None


def _check_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "a non-empty list of message objects is required")
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(p, "must be an object with role and content")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{p}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content, calls = m.get("content"), m.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise _bad(f"{p}.tool_calls", "only assistant messages carry tool_calls, a list")
            for j, tc in enumerate(calls):
                f = tc.get("function") if isinstance(tc, dict) else None
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    shape = '{"type": "function", "function": {"name", "arguments"}}'
                    raise _bad(f"{p}.tool_calls[{j}]", f"must be {shape}")
                if not isinstance(f.get("arguments", ""), str | dict):
                    raise _bad(f"{p}.tool_calls[{j}].function.arguments", "must be a JSON string")
        if content is None:
            if not (role == "assistant" and calls):
                raise _bad(f"{p}.content", "is required (a string) except on assistant messages with tool_calls")
        elif isinstance(content, list):
            if not all(isinstance(part, dict) and isinstance(part.get("type"), str) for part in content):
                raise _bad(f"{p}.content", "a list of content parts must hold objects with a type")
        elif not isinstance(content, str):
            raise _bad(f"{p}.content", f"must be a string, got {type(content).__name__}")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise _bad(f"{p}.{key}", "must be a string")
    return messages


def _check_tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list of function tools")
    for i, t in enumerate(tools):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or t.get("type", "function") != "function":
            raise _bad(f"tools[{i}]", 'must be {"type": "function", "function": {"name", "parameters"}}')
        if not isinstance(f.get("name"), str) or not f["name"]:
            raise _bad(f"tools[{i}].function.name", "a non-empty string is required")
        if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
            raise _bad(f"tools[{i}].function.parameters", "must be a JSON Schema object")
        if f.get("description") is not None and not isinstance(f["description"], str):
            raise _bad(f"tools[{i}].function.description", "must be a string")
    return tools or None


def validate_request(body) -> ChatParams:
    """The request's fields checked for type and range (400 ApiError naming the field); unknown fields are ignored."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
    if body.get("stream") not in (None, False):
        if body["stream"] is True:
            raise _bad("stream", "stream=true is not supported by serve.local", code="unsupported_value")
        raise _bad("stream", "must be a boolean")
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise _bad("n", f"n must be 1 (serve.local returns one choice), got {n!r}")
    params = ChatParams(messages=_check_messages(body.get("messages")), tools=_check_tools(body.get("tools")))
    if (t := body.get("temperature")) is not None:
        if not _is_number(t) or not 0 <= t <= 2:
            raise _bad("temperature", f"must be a number between 0 and 2, got {t!r}")
        params.temperature = float(t)
    if (p := body.get("top_p")) is not None:
        if not _is_number(p) or not 0 < p <= 1:
            raise _bad("top_p", f"must be a number in (0, 1], got {p!r}")
        params.top_p = float(p)
    for key in ("max_completion_tokens", "max_tokens"):  # max_tokens wins when both are given
        if (v := body.get(key)) is not None:
            if not _is_int(v) or v < 1:
                raise _bad(key, f"must be an integer >= 1, got {v!r}")
            params.max_tokens = v
    if (s := body.get("seed")) is not None:
        if not _is_int(s) or not SEED_RANGE[0] <= s <= SEED_RANGE[1]:
            raise _bad("seed", f"must be a 64-bit integer, got {s!r}")
        params.seed = s
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stops is not None:
        if not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES:
            raise _bad("stop", f"must be a string or a list of at most {MAX_STOP_SEQUENCES} strings")
        if not all(isinstance(s, str) and s for s in stops):
            raise _bad("stop", "stop sequences must be non-empty strings")
        params.stop = stops
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise _bad("model", "must be a string")
    params.model = body.get("model")
    return params


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(remaining content, OpenAI tool_calls) from generated text. A block that is not a JSON object with a name
    stays in the content, so a malformed action reaches the caller (and the loop counts a model error)."""
    calls, kept = [], []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str):
                raise TypeError("name")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            continue
        kept.append(text[pos : m.start()])
        pos = m.end()
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


class Cancelled(Exception):
    """A generation stopped before its end because its client left or the server is shutting down."""


class _Job:
    """One admitted request: its cancel flag and, once generating, why it stopped early."""

    def __init__(self):
        self.cancel = threading.Event()
        self.cancel_reason: str | None = None  # "disconnect" | "shutdown"
        self.stopped_by: str | None = None  # "cancel" | "deadline" | "stop"

    def cancel_for(self, reason: str) -> None:
        self.cancel_reason = self.cancel_reason or reason
        self.cancel.set()


class _Limiter(StoppingCriteria):
    """Ends generation on the job's cancel flag, at its wall-clock deadline, or when a stop sequence appears."""

    def __init__(self, job: _Job, deadline: float, n_prompt: int, stop: list[str], tokenizer):
        self.job, self.deadline, self.n_prompt, self.stop, self.tokenizer = job, deadline, n_prompt, stop, tokenizer
        self.window = max((len(s) for s in stop), default=0) + 8  # tokens decoded to look for a stop sequence

    def _why(self, input_ids: torch.LongTensor) -> str | None:
        if self.job.cancel.is_set():
            return "cancel"
        if time.monotonic() >= self.deadline:
            return "deadline"
        if self.stop:
            start = max(self.n_prompt, input_ids.shape[1] - self.window)
            tail = self.tokenizer.decode(input_ids[0, start:], skip_special_tokens=True)
            if any(s in tail for s in self.stop):
                return "stop"
        return None

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        why = self._why(input_ids)
        if why:
            self.job.stopped_by = why
        return torch.full((input_ids.shape[0],), bool(why), dtype=torch.bool, device=input_ids.device)


@dataclasses.dataclass
class _Prepared:
    params: ChatParams
    enc: dict
    n_prompt: int
    max_new: int


def _context_length(config, tokenizer) -> int | None:
    try:
        config = config.get_text_config()
    except (AttributeError, TypeError):
        pass
    n = getattr(config, "max_position_embeddings", None)
    if _is_int(n) and n > 0:
        return n
    n = getattr(tokenizer, "model_max_length", None)
    return n if _is_int(n) and 0 < n < 10**7 else None  # transformers' "no limit" is ~1e30


class ChatModel:
    """A tokenizer + causal LM; generations run one at a time on one worker thread, behind an admission count."""

    def __init__(self, model_dir: str | os.PathLike, name: str | None = None, limits: ServeLimits | None = None):
        if problem := checkpoint_problem(model_dir):
            raise FileNotFoundError(f"--model {problem}")
        self.name = name or Path(model_dir).name
        self.limits = limits or ServeLimits()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        if torch.cuda.is_available():
            self.model.to("cuda")
        self.context_length = self.limits.context_length or _context_length(self.model.config, self.tokenizer)
        self.max_tokens_limit = self.limits.max_tokens_limit or self.context_length or FALLBACK_MAX_TOKENS
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer must not be used from two threads at once
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="serve.local-gen")
        self._state = threading.Lock()
        self._jobs: set[_Job] = set()
        self._running = 0
        self._avg_s = 1.0  # moving average of a generation's duration, for Retry-After
        self.closing = False
        self.stats = {"completed": 0, "cancelled": 0, "timed_out": 0, "rejected_busy": 0, "generated_tokens": 0}

    # admission ---------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        with self._state:
            return {"generating": self._running, "queued": len(self._jobs) - self._running, **self.stats}

    def admit(self) -> _Job:
        """A job slot, or 429 (Retry-After) when max_queue requests already wait behind the running one."""
        with self._state:
            if self.closing:
                raise ApiError(503, "serve.local is shutting down", code="shutting_down")
            if len(self._jobs) >= 1 + self.limits.max_queue:
                self.stats["rejected_busy"] += 1
                wait = min(60, max(1, math.ceil(self._avg_s * len(self._jobs))))
                raise ApiError(
                    429,
                    f"serve.local is busy: one generation runs and {len(self._jobs) - 1} wait (max_queue "
                    f"{self.limits.max_queue}); retry after {wait} s",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(wait)},
                )
            job = _Job()
            self._jobs.add(job)
            return job

    def release(self, job: _Job) -> None:
        with self._state:
            self._jobs.discard(job)

    def shutdown(self) -> None:
        """Refuse new requests, stop the running generation at its next token, drop the queued ones."""
        with self._state:
            self.closing = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel_for("shutdown")
        self._worker.shutdown(wait=False, cancel_futures=True)

    # work ----------------------------------------------------------------------------------------------------------
    def prepare(self, params: ChatParams) -> _Prepared:
        """Render and tokenize the prompt; 400 when it, or it plus max_tokens, does not fit the context."""
        try:
            with self._tokenizer_lock:
                enc = self.tokenizer.apply_chat_template(
                    params.messages,
                    tools=params.tools,
                    add_generation_prompt=True,
                    return_tensors="pt",
                    return_dict=True,
                )
        except Exception as e:  # template errors name the offending message field
            raise ApiError(400, f"messages/tools could not be rendered by the chat template: {e}") from e
        n_prompt = int(enc["input_ids"].shape[1])
        ctx = self.context_length
        if params.max_tokens is not None and params.max_tokens > self.max_tokens_limit:
            raise _bad("max_tokens", f"must be at most {self.max_tokens_limit}, got {params.max_tokens}")
        if ctx is not None and n_prompt >= ctx:
            raise ApiError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, your messages (with tools) take "
                f"{n_prompt} tokens, which leaves no room for a completion.",
                param="messages",
                code="context_length_exceeded",
            )
        if params.max_tokens is None:
            max_new = min(DEFAULT_MAX_TOKENS, self.max_tokens_limit, ctx - n_prompt if ctx else DEFAULT_MAX_TOKENS)
        else:
            max_new = params.max_tokens
            if ctx is not None and n_prompt + max_new > ctx:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {ctx} tokens. However, you requested "
                    f"{n_prompt + max_new} tokens ({n_prompt} in the messages, {max_new} in the completion). "
                    f"Please reduce the length of the messages or max_tokens.",
                    param="max_tokens",
                    code="context_length_exceeded",
                )
        return _Prepared(params, dict(enc), n_prompt, max_new)

    def submit(self, prep: _Prepared, job: _Job) -> concurrent.futures.Future:
        try:
            return self._worker.submit(self._generate, prep, job)
        except RuntimeError as e:  # the worker was shut down
            raise ApiError(503, "serve.local is shutting down", code="shutting_down") from e

    def _generate(self, prep: _Prepared, job: _Job) -> dict:
        if job.cancel.is_set():
            raise Cancelled(job.cancel_reason)
        with self._state:
            self._running += 1
        t0 = time.monotonic()
        try:
            return self._generate_now(prep, job, t0)
        finally:
            with self._state:
                self._running -= 1
                self._avg_s = 0.8 * self._avg_s + 0.2 * (time.monotonic() - t0)

    def _generate_now(self, prep: _Prepared, job: _Job, t0: float) -> dict:
        params, n_prompt, max_new = prep.params, prep.n_prompt, prep.max_new
        enc = {k: v.to(self.model.device) for k, v in prep.enc.items()}
        gen_kwargs = {"max_new_tokens": max_new, "pad_token_id": self.tokenizer.pad_token_id}
        if params.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        limiter = _Limiter(job, t0 + self.limits.max_generation_s, n_prompt, params.stop, self.tokenizer)
        with torch.inference_mode():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.model.generate(**enc, **gen_kwargs, stopping_criteria=StoppingCriteriaList([limiter]))
        new = out[0, n_prompt:]
        self.stats["generated_tokens"] += int(len(new))
        if job.stopped_by == "cancel":
            self.stats["cancelled"] += 1
            raise Cancelled(job.cancel_reason)
        if job.stopped_by == "deadline":
            self.stats["timed_out"] += 1
            log.warning("generation cut at max_generation_s=%s (%d tokens)", self.limits.max_generation_s, len(new))
        self.stats["completed"] += 1
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        hit_stop = False
        if params.stop:
            cut = min((i for i in (text.find(s) for s in params.stop) if i >= 0), default=-1)
            if cut >= 0:
                text, hit_stop = text[:cut], True
        hit_eos = bool(len(new)) and int(new[-1]) == self.tokenizer.eos_token_id
        content, calls = parse_tool_calls(text)
        if calls:
            finish = "tool_calls"
        elif hit_stop or hit_eos or (job.stopped_by is None and len(new) < max_new):  # other eos ids of the config
            finish = "stop"
        else:
            finish = "length"  # max_tokens or max_generation_s
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": params.model or self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": int(len(new)),
                "total_tokens": n_prompt + int(len(new)),
            },
        }

    def complete(self, body: dict) -> dict:
        """One request without HTTP (validated, admitted and queued like one)."""
        job = self.admit()
        try:
            return self.submit(self.prepare(validate_request(body)), job).result()
        finally:
            self.release(job)


async def _read_json(request: Request, limit: int):
    """The body parsed as JSON; 413 past `limit` bytes (a body up to 8x the limit is read and dropped first, so the
    client sees the 413 rather than a reset connection), 400 when it is not JSON."""
    too_large = ApiError(
        413,
        f"request body is larger than {limit} bytes (serve.local max_body_bytes)",
        code="request_too_large",
    )
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "invalid Content-Length header", code="invalid_body")
        if int(declared) > 8 * limit:
            raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > 8 * limit:
            break
    if size > limit:
        raise too_large
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, absurd nesting
        raise ApiError(400, f"the request body is not valid JSON: {str(e)[:200]}", code="invalid_body") from e


# ---- slow clients: read timeouts, a connection cap, bounded logging ------------------------------------------------

# The listen backlog; asyncio also accepts up to this many connections in one loop pass before their protocols run
# (uvicorn's default of 2048 let one pass take more sockets than a 1,024 open-file limit has).
ACCEPT_BACKLOG = 100
# Open files serve.local needs besides its `max_connections` sockets: up to 2 x ACCEPT_BACKLOG sockets on their way
# in (accepted, not yet counted) or out (closed, released at the next pass), plus the model's files, the event loop,
# pipes and logs.
FD_HEADROOM = 2 * ACCEPT_BACKLOG + 100


def ensure_open_files(limits: ServeLimits) -> int:
    """Raise this process's soft open-file limit to fit max_connections (up to the hard limit); ValueError naming
    both numbers when even the hard limit is too low. Returns the soft limit in force."""
    need = limits.max_connections + FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ValueError(
                f"max_connections={limits.max_connections} needs {need} open files ({FD_HEADROOM} besides the "
                f"connections) but this process may open at most {hard} (ulimit -Hn): set --max-connections "
                f"{max(1, hard - FD_HEADROOM)} or less, or raise the limit"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        soft = need
    return soft


class _LogLimiter(logging.Filter):
    """Bounded logging: at WARNING and above, at most `burst` records per `window_s` of one kind (logger, level, the
    first line of the message with its numbers blanked) and `total` of all kinds; the first record of a kind let
    through after some were dropped says how many. A flood of one failure (clients sending garbage, accept() out of
    file descriptors) then writes a few lines instead of one per event."""

    def __init__(self, burst: int = 5, total: int = 100, window_s: float = 10.0):
        super().__init__()
        self.burst, self.total, self.window_s = burst, total, window_s
        self._lock = threading.Lock()
        self._window = -math.inf
        self._kinds: dict[tuple, list[int]] = {}  # kind -> [let through this window, dropped since last let through]
        self._passed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        try:
            first = record.getMessage().split("\n", 1)[0]
        except Exception:  # noqa: BLE001 - a record that cannot format is still one kind
            first = str(record.msg)
        kind = (record.name, record.levelno, re.sub(r"\d+", "N", first)[:80])
        with self._lock:
            now = time.monotonic()
            if now - self._window >= self.window_s:
                self._window, self._passed = now, 0
                for counts in self._kinds.values():
                    counts[0] = 0
                if len(self._kinds) > 1000:
                    self._kinds = {k: v for k, v in self._kinds.items() if v[1]}
            counts = self._kinds.setdefault(kind, [0, 0])
            if counts[0] >= self.burst or self._passed >= self.total:
                counts[1] += 1
                return False
            counts[0] += 1
            self._passed += 1
            dropped, counts[1] = counts[1], 0
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this were not logged]"
        return True


_LOG_LIMITER = _LogLimiter()
LIMITED_LOGGERS = ("uvicorn", "uvicorn.error", "asyncio", __name__)


def bound_logging() -> None:
    """Put the one rate limiter on the loggers a hostile client can make write (idempotent)."""
    for name in LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if _LOG_LIMITER not in logger.filters:
            logger.addFilter(_LOG_LIMITER)


def _raw_error(status: int, message: str, code: str, headers: tuple[str, ...] = ()) -> bytes:
    """A complete HTTP/1.1 error response with an OpenAI-style body, written straight to a connection that is closed
    next (no request of it reached the app)."""
    err = {"message": message, "type": _ERROR_TYPES.get(status, "invalid_request_error"), "param": None, "code": code}
    body = json.dumps({"error": err}).encode()
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close", *headers]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class ConnectionGuard:
    """The slow-client rules of one server, shared by its connections; `stats` is reported by /health."""

    def __init__(self, limits: ServeLimits):
        self.limits = limits
        self.connections: set = set()  # uvicorn's set of open connections (protocol objects), bound at the first one
        self.stats = {"header_timeouts": 0, "body_timeouts": 0, "evicted_idle": 0, "refused_connections": 0}

    def status(self) -> dict:
        return {"open_connections": len(self.connections), **self.stats}

    def protocol(self) -> type[H11Protocol]:
        """uvicorn's h11 protocol class with this guard's read deadlines and connection cap."""
        guard = self

        class GuardedH11Protocol(_GuardedH11Protocol):
            _guard = guard

        return GuardedH11Protocol


class _GuardedH11Protocol(H11Protocol):
    """Phases of a connection: "headers" (waiting for a request's headers: since the connection opened or the last
    response ended; header_timeout_s), "body" (headers read, body still arriving; body_timeout_s from the headers)
    and otherwise the app's (a generation is bounded by max_generation_s). A deadline that passes gets 408 and the
    connection is closed (silently when the client has sent nothing since it became idle)."""

    _guard: ConnectionGuard

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        g = self._guard
        g.connections = self.connections
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = self.loop.time()
        self._body_since: float | None = None
        self._partial = False  # bytes of a request arrived while waiting for headers
        open_now = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_now) > g.limits.max_connections:
            idle = [
                c for c in open_now if c is not self and isinstance(c, _GuardedH11Protocol) and c._phase() == "headers"
            ]
            if not idle:
                g.stats["refused_connections"] += 1
                log.warning("serve.local: %d connections open, each with a request in progress (max_connections): "
                            "new connection refused with 503", len(open_now) - 1)  # fmt: skip
                msg = (f"serve.local has max_connections={g.limits.max_connections} connections open, each with a "
                       "request in progress; retry later")  # fmt: skip
                self.transport.write(_raw_error(503, msg, "too_many_connections", ("retry-after: 1",)))
                self.transport.close()
                return
            oldest = min(idle, key=lambda c: c._idle_since)
            g.stats["evicted_idle"] += 1
            log.warning("serve.local: %d connections open (max_connections): closed the longest idle one (%.1f s)",
                        len(open_now) - 1, self.loop.time() - oldest._idle_since)  # fmt: skip
            oldest._close(503, "serve.local has too many open connections; this one had not sent a complete request",
                          "too_many_connections", ("retry-after: 1",))  # fmt: skip
        self._arm(g.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase() == "headers":
            self._partial = True
        super().data_received(data)
        self._note_body()

    def on_response_complete(self) -> None:
        self._idle_since, self._body_since, self._partial = self.loop.time(), None, False
        super().on_response_complete()  # may start a pipelined request
        self._note_body()

    def _note_body(self) -> None:
        if self._body_since is None and self.conn.their_state is h11.SEND_BODY:
            self._body_since = self.loop.time()

    def _phase(self) -> str | None:
        if self.transport.is_closing():
            return None
        state = self.conn.their_state
        if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            return "headers"
        return "body" if state is h11.SEND_BODY else None

    def _arm(self, delay: float) -> None:
        self._timer = self.loop.call_later(max(delay, 0.01), self._check)

    def _check(self) -> None:
        self._timer = None
        limits, phase, now = self._guard.limits, self._phase(), self.loop.time()
        if phase is None:
            if not self.transport.is_closing():  # the app answers: look again later
                self._arm(min(limits.header_timeout_s, limits.body_timeout_s))
            return
        if phase == "headers":
            since, limit = self._idle_since, limits.header_timeout_s
        else:
            self._note_body()
            since, limit = self._body_since or now, limits.body_timeout_s
        if now < since + limit:
            self._arm(since + limit - now)
            return
        key = "header" if phase == "headers" else "body"
        self._guard.stats[f"{key}_timeouts"] += 1
        what = "request headers" if phase == "headers" else "request body"
        log.warning("serve.local: %s not complete %.0f s after %s (%s_timeout_s): 408, connection closed", what, limit,
                    "the connection became idle" if phase == "headers" else "the headers", key)  # fmt: skip
        msg = f"the {what} did not arrive within {limit:g} s (serve.local {key}_timeout_s)"
        self._close(408, msg, "request_timeout")

    def _close(self, status: int, message: str, code: str, headers: tuple[str, ...] = ()) -> None:
        """Answer `status` unless the client has sent nothing since it became idle (or a response is under way), then
        close the connection."""
        if self.transport.is_closing():
            return
        started = self.cycle is not None and not self.cycle.response_complete and self.cycle.response_started
        if (self._partial or self._phase() == "body") and not started:
            self.transport.write(_raw_error(status, message, code, headers))
        self.transport.close()


async def _result_or_cancel(fut: concurrent.futures.Future, request: Request, job: _Job):
    """The generation's result; when the client disconnects first, the job is cancelled (queued: dropped; running:
    stopped at the next token) and None is returned."""
    waiter = asyncio.wrap_future(fut)
    while True:
        done, _ = await asyncio.wait({waiter}, timeout=DISCONNECT_POLL_S)
        if done:
            if waiter.cancelled():  # dropped from the queue by shutdown()
                raise Cancelled(job.cancel_reason or "shutdown")
            return waiter.result()
        if await request.is_disconnected():
            job.cancel_for("disconnect")
            waiter.cancel()  # also cancels fut if it has not started
            return None


def create_app(model_dir: str | os.PathLike, name: str | None = None, limits: ServeLimits | None = None) -> FastAPI:
    """The FastAPI app serving one checkpoint (the ChatModel is app.state.chat)."""
    chat = ChatModel(model_dir, name, limits)
    app = FastAPI(title="omni-decision local server")
    app.state.chat = chat
    app.state.guard = guard = ConnectionGuard(chat.limits)
    bound_logging()

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None)).response()

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("serve.local: unexpected error")
        return ApiError(500, f"internal error: {type(exc).__name__}").response()

    # async handlers run on the event loop: they answer while a generation holds the worker thread
    @app.get("/health")
    async def health() -> dict:
        state = "shutting_down" if chat.closing else "ok"
        return {"status": state, "model": chat.name, **chat.status(), **guard.status()}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": chat.name, "object": "model", "created": 0, "owned_by": "local"}]}

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Response:
        try:
            body = await _read_json(request, chat.limits.max_body_bytes)
        except ClientDisconnect:  # left (or was closed at body_timeout_s) before the body arrived: nobody listens
            return Response(status_code=499)
        params = validate_request(body)
        job = chat.admit()
        try:
            prep = await asyncio.to_thread(chat.prepare, params)
            result = await _result_or_cancel(chat.submit(prep, job), request, job)
        except Cancelled as e:
            if job.cancel_reason == "shutdown":
                msg = "serve.local is shutting down; the generation was stopped"
                raise ApiError(503, msg, code="shutting_down") from e
            return Response(status_code=499)  # nobody is listening
        finally:
            chat.release(job)
        if result is None:
            return Response(status_code=499)  # client closed the request (nginx's code); nobody reads it
        return JSONResponse(result)

    return app


class _Server(uvicorn.Server):
    """uvicorn that stops the running generation when it is told to exit (SIGTERM/SIGINT), so its graceful shutdown
    does not wait for a generation to end by itself."""

    def __init__(self, config: uvicorn.Config, chat: ChatModel):
        super().__init__(config)
        self.chat = chat

    def handle_exit(self, sig, frame) -> None:
        self.chat.shutdown()
        super().handle_exit(sig, frame)


def _uvicorn_config(app: FastAPI, host: str, port: int, **kw) -> uvicorn.Config:
    # the graceful-shutdown timeout is a backstop: a cancelled generation ends within one token; always the h11
    # protocol, with the read deadlines and the connection cap of app.state.guard
    guard: ConnectionGuard = app.state.guard
    ensure_open_files(guard.limits)
    cfg = uvicorn.Config(
        app, host=host, port=port, timeout_graceful_shutdown=5, http=guard.protocol(), backlog=ACCEPT_BACKLOG, **kw
    )
    bound_logging()  # after uvicorn's dictConfig
    return cfg


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalServer:
    """Serve a checkpoint from a background thread (tests, demo): `with LocalServer(dir) as srv: srv.base_url`.
    Keyword `limits` go to ServeLimits (max_queue=..., max_generation_s=...)."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        host: str = "127.0.0.1",
        port: int | None = None,
        name: str | None = None,
        startup_timeout_s: float = 120.0,
        **limits,
    ):
        self.model_dir, self.host, self.name = model_dir, host, name
        self.limits = ServeLimits(**limits)
        self.port = port or free_port(host)
        self.startup_timeout_s = startup_timeout_s
        self.app: FastAPI | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> LocalServer:
        ensure_open_files(self.limits)  # before the model loads
        self.app = create_app(self.model_dir, self.name, self.limits)
        cfg = _uvicorn_config(self.app, self.host, self.port, log_level="warning", lifespan="off")
        self._server = _Server(cfg, self.app.state.chat)
        self._thread = threading.Thread(target=self._server.run, name="serve.local", daemon=True)
        self._thread.start()
        deadline = time.time() + self.startup_timeout_s
        while time.time() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError(f"serve.local on {self.host}:{self.port} exited during startup")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise TimeoutError(f"serve.local did not answer /v1/models on port {self.port} in {self.startup_timeout_s}s")

    def __exit__(self, *exc) -> None:
        if self.app is not None:
            self.app.state.chat.shutdown()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(ServeLimits))


@dataclasses.dataclass(frozen=True)
class LocalServeConfig(ServeLimits):
    """A serve.local recipe (configs/serve/tiny_local.yaml): the checkpoint, where to listen, the served name, and the
    limits (ServeLimits' keys, at the top level). Loaded by collect.config.load_recipe like every other recipe."""

    model: str | None = None  # save_pretrained checkpoint directory
    host: str = "127.0.0.1"
    port: int = 8011
    name: str | None = None  # served model name (default: the directory name)


CONFIG_KEYS = tuple(f.name for f in dataclasses.fields(LocalServeConfig))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible local server for a transformers checkpoint")
    ap.add_argument("--config", help="YAML with model, host, port, name and limits (CLI flags override)")
    ap.add_argument("--model", help="save_pretrained checkpoint directory")
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--name", default=None, help="served model name (default: the directory name)")
    ap.add_argument("--max-body-bytes", type=int, default=None, help="larger request bodies get 413 (default 2 MiB)")
    ap.add_argument("--max-queue", type=int, default=None, help="requests waiting behind a generation; more get 429")
    ap.add_argument("--max-generation-s", type=float, default=None, help="wall-clock limit of one generation (300)")
    ap.add_argument("--max-tokens-limit", type=int, default=None, help="largest max_tokens (default: the context)")
    ap.add_argument("--context-length", type=int, default=None, help="default: config.max_position_embeddings")
    ap.add_argument("--header-timeout-s", type=float, default=None, help="request headers must arrive in this (10)")
    ap.add_argument(
        "--body-timeout-s", type=float, default=None, help="a body must arrive this after its headers (30)"
    )
    ap.add_argument("--max-connections", type=int, default=None, help="open connections at most (256)")
    a = ap.parse_args(argv)
    flags = {k: getattr(a, k) for k in CONFIG_KEYS if getattr(a, k, None) is not None}
    try:
        cfg = (
            load_recipe(LocalServeConfig, a.config, flags, "serve.local recipe")
            if a.config
            else from_mapping(LocalServeConfig, flags, "")
        )
        if not cfg.model:
            raise ConfigError("--model (or model: in --config) is required")
        server_limits = ServeLimits(**{k: getattr(cfg, k) for k in LIMIT_KEYS})
        ensure_open_files(server_limits)
    except (ValueError, FileNotFoundError) as e:
        ap.error(str(e))
    if problem := checkpoint_problem(cfg.model) or port_problem(cfg.host, cfg.port):
        ap.error(problem)  # before the model is loaded
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = create_app(cfg.model, cfg.name, server_limits)
    server = _Server(_uvicorn_config(app, cfg.host, cfg.port, log_level="info"), app.state.chat)
    server.run()


if __name__ == "__main__":
    run_cli(main, "the server was stopped")
