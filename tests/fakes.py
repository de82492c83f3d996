"""A scripted fake OpenAI-compatible chat server on loopback, plus a fake ToolBox, for tests.

    with FakeChatServer() as srv:                      # http.server in a thread, port chosen by the OS
        srv.script("planner", tool_call("web_search", {"query": "x"}), fault_500(), text("<tool_call>...</tool_call>"))
        srv.script("critic", text('{"verdict": "SUFFICIENT", ...}'))
        cfg = EndpointConfig(base_url=srv.base_url, model="fake")

Requests are routed to a role by the marker `# Role: <name>` in the system message (the prompt files in
collect/roles/prompts/ start with it); requests without one go to role "default". Each role has a FIFO of replies;
`srv.default(role, reply)` answers when the FIFO is empty. With neither, the server answers HTTP 400 (not retried by
the client) and records the miss in `srv.misses`, so an under-scripted test fails loudly.

Faults: fault_500(), fault_429(retry_after), hang(seconds), malformed() (200 with a non-JSON body),
truncated_tool_call(name, args) (arguments string cut mid-JSON), empty() (content "" and no tool calls).
Every reply may carry `delay_s` (latency). `srv.requests` records (role, body) of every request; `srv.max_in_flight`
is the largest number of requests handled at once (for concurrency-limit tests).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from collect.ledger import NormalizedObservation

ROLE_RE = re.compile(r"#\s*Role:\s*([a-z_]+)")


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[dict] | None = None
    status: int = 200
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)
    raw_body: str | None = None  # sent verbatim instead of a completion object (malformed bodies)
    prompt_tokens: int | None = None
    completion_tokens: int = 7


def text(content: str, **kw) -> Reply:
    return Reply(content=content, **kw)


def tool_call(name: str, arguments: dict, **kw) -> Reply:
    return Reply(
        content=None,
        tool_calls=[
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
        **kw,
    )


def truncated_tool_call(name: str, arguments: dict, **kw) -> Reply:
    args = json.dumps(arguments)
    r = tool_call(name, arguments, **kw)
    r.tool_calls[0]["function"]["arguments"] = args[: max(1, len(args) // 2)]
    return r


def empty(**kw) -> Reply:
    return Reply(content="", **kw)


def fault_500(**kw) -> Reply:
    return Reply(status=500, raw_body=json.dumps({"error": {"message": "injected server error"}}), **kw)


def fault_429(retry_after: float | None = None, **kw) -> Reply:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    return Reply(status=429, raw_body=json.dumps({"error": {"message": "injected rate limit"}}), headers=headers, **kw)


def hang(seconds: float) -> Reply:
    """Answer only after `seconds` (longer than the client's timeout): the client must time out."""
    return Reply(content="too late", delay_s=seconds)


def malformed(**kw) -> Reply:
    return Reply(status=200, raw_body='{"id": "x", "choices": [ {"message": ', **kw)


class FakeChatServer:
    def __init__(self, host: str = "127.0.0.1"):
        self._queues: dict[str, deque[Reply]] = defaultdict(deque)
        self._defaults: dict[str, Reply] = {}
        self._lock = threading.Lock()
        self.requests: list[tuple[str, dict]] = []
        self.misses: list[str] = []
        self.auth_headers: list[str] = []  # Authorization header of every request (secrets tests)
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output clean
                pass

            def do_POST(self):  # noqa: N802 - http.server API
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                server.auth_headers.append(self.headers.get("Authorization") or "")
                server._handle(self, body)

            def do_GET(self):  # noqa: N802 - /v1/models for start-up checks
                server.auth_headers.append(self.headers.get("Authorization") or "")
                server._send(self, 200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model"}]}))

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # ---- API -------------------------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, role: str, *replies: Reply) -> FakeChatServer:
        with self._lock:
            self._queues[role].extend(replies)
        return self

    def default(self, role: str, reply: Reply) -> FakeChatServer:
        with self._lock:
            self._defaults[role] = reply
        return self

    def pending(self, role: str) -> int:
        with self._lock:
            return len(self._queues[role])

    def role_requests(self, role: str) -> list[dict]:
        return [b for r, b in self.requests if r == role]

    def start(self) -> FakeChatServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- handling --------------------------------------------------------------------------------------------------
    @staticmethod
    def role_of(body: dict) -> str:
        for m in body.get("messages", []):
            if m.get("role") == "system":
                found = ROLE_RE.search(m.get("content") or "")
                if found:
                    return found.group(1)
        return "default"

    def _handle(self, h: BaseHTTPRequestHandler, body: dict) -> None:
        role = self.role_of(body)
        with self._lock:
            self.requests.append((role, body))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            reply = self._queues[role].popleft() if self._queues[role] else self._defaults.get(role)
            if reply is None:
                self.misses.append(role)
        released = False

        def send(status: int, text: str, headers: dict | None = None) -> None:
            # a request stops being in flight when its reply starts: the client may send its next request as soon as
            # it has read this one, possibly before this thread would reach a `finally` (max_in_flight races)
            nonlocal released
            with self._lock:
                self.in_flight -= 1
            released = True
            self._send(h, status, text, headers)

        try:
            if reply is None:
                send(400, json.dumps({"error": {"message": f"fake server: no scripted reply for {role!r}"}}))
                return
            if reply.delay_s:
                time.sleep(reply.delay_s)
            if reply.raw_body is not None:
                send(reply.status, reply.raw_body, reply.headers)
                return
            prompt_tokens = reply.prompt_tokens
            if prompt_tokens is None:  # a crude but monotone token count: whitespace words of the request
                prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in body.get("messages", []))
            msg = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls}
            completion = {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "fake"),
                "choices": [
                    {"index": 0, "message": msg, "finish_reason": "tool_calls" if reply.tool_calls else "stop"}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": prompt_tokens + reply.completion_tokens,
                },
            }
            send(reply.status, json.dumps(completion), reply.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout test)
        finally:
            if not released:
                with self._lock:
                    self.in_flight -= 1

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: str, headers: dict | None = None) -> None:
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)


# --------------------------------------------------------------------------------------------------------------------
# Fake ToolBox: scripted observations per tool
# --------------------------------------------------------------------------------------------------------------------


def _schema(name: str, props: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"fake {name}",
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


class FakeToolBox:
    """Same interface as collect.tools.ToolBox. `results[tool]` is a FIFO of raw texts or exceptions; when empty,
    `fallback(name, arguments)` (default: echo the arguments) produces the raw text."""

    def __init__(self, failure_cls: type[Exception], fallback=None):
        self.failure_cls = failure_cls
        self.results: dict[str, deque] = defaultdict(deque)
        self.calls: list[tuple[str, dict]] = []
        self.fallback = fallback or (lambda name, args: f"{name} result for {json.dumps(args, sort_keys=True)}")

    def queue(self, tool: str, *results) -> FakeToolBox:
        self.results[tool].extend(results)
        return self

    def schemas(self) -> list[dict]:
        need = {"need_index": {"type": "integer"}}
        q = {"query": {"type": "string"}, **need}
        return [
            _schema("subtitle_grounding", {**q, "asset_id": {"type": "string"}}, ["query"]),
            _schema("frame_confirm", {**q, "asset_id": {"type": "string"}}, ["query"]),
            _schema("web_search", q, ["query"]),
            _schema("code_executor", {"code": {"type": "string"}, **need}, ["code"]),
        ]

    async def execute(self, name: str, arguments: dict) -> tuple[str, NormalizedObservation]:
        self.calls.append((name, arguments))
        r = self.results[name].popleft() if self.results[name] else self.fallback(name, arguments)
        if isinstance(r, Exception):
            raise r
        raw = str(r)
        return raw, NormalizedObservation(tool=name, ok=True, summary=raw[:300], items=(raw[:100],))
