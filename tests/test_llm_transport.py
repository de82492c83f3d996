"""The chat client's own HTTP/1.1 transport for plain http:// endpoints (collect/llm.py `_Http1`), against raw
loopback servers that send exactly the bytes a test scripts: keep-alive reuse, servers that close connections
(after a reply, while idle, in the middle of a reply), chunked and gzip bodies, non-2xx with Retry-After, timeouts,
redirects (the SDK client takes over), and parity with the SDK path on the same replies."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
import zlib
from collections import deque

import pytest

from collect.config import EndpointConfig
from collect.llm import ChatClient, ChatError, _lean_url
from tests.fakes import FakeChatServer, Reply, fault_429, fault_500, malformed, text, tool_call

MSG = [{"role": "user", "content": "one two three"}]


def completion(content="ok", *, tool_calls=None, usage=None) -> bytes:
    msg = {"role": "assistant", "content": content}
    if tool_calls is not None:
        msg["tool_calls"] = tool_calls
    body = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": msg}],
        "usage": usage or {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    return json.dumps(body).encode()


def reply(body: bytes, status: str = "200 OK", headers: tuple = (), version: str = "HTTP/1.1") -> bytes:
    head = [f"{version} {status}", "Content-Type: application/json", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(body: bytes, sizes=(7, 1, 50)) -> bytes:
    out, i, k = b"", 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        part = body[i : i + n]
        out += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
        i, k = i + n, k + 1
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + out + b"0\r\nX-Trailer: t\r\n\r\n"


class RawServer:
    """A threaded loopback server answering each request (head + Content-Length body) with the next scripted step:
    bytes to send, then optionally `close` the connection, `idle_close` it shortly after (no Connection: close
    header: the client finds out on its next call), or `delay_s` before sending. Counts connections and requests."""

    def __init__(self):
        self.steps: deque = deque()
        self.default: dict | None = None
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"

    def script(self, *steps: dict) -> RawServer:
        self.steps.extend(steps)
        return self

    def _accept(self):
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket):
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                self.requests.append((head, body))
                step = self.steps.popleft() if self.steps else self.default
                if step is None:
                    return
                time.sleep(step.get("delay_s", 0))
                try:
                    conn.sendall(step["send"])
                except OSError:
                    return
                if step.get("close"):
                    return
                if step.get("idle_close"):
                    time.sleep(0.05)
                    conn.shutdown(socket.SHUT_RDWR)
                    return

    def close(self):
        self._stop = True
        self._sock.close()


@pytest.fixture
def raw():
    s = RawServer()
    yield s
    s.close()


def ep(url: str, **kw) -> EndpointConfig:
    base = {"base_url": url, "model": "m", "max_retries": 2, "timeout_s": 5, "backoff_base_s": 0.01}
    return EndpointConfig(**{**base, **kw})


def calls(cfg: EndpointConfig, n: int = 1, *, sequential: bool = True, pause_s: float = 0.0, **client_kw):
    """n chat() calls on one client (one after another, or all at once); returns (results or exceptions, client)."""

    async def go():
        c = ChatClient(cfg, **client_kw)
        try:
            if not sequential:
                return await asyncio.gather(*(c.chat(MSG) for _ in range(n)), return_exceptions=True), c
            out = []
            for _ in range(n):
                try:
                    out.append(await asyncio.wait_for(c.chat(MSG), 15))
                except ChatError as e:
                    out.append(e)
                await asyncio.sleep(pause_s)
            return out, c
        finally:
            await c.close()

    return asyncio.run(go())


# --------------------------------------------------------------------------------------------------------------------
# which endpoints take the lean transport
# --------------------------------------------------------------------------------------------------------------------


def test_only_plain_http_without_proxy_credentials_or_query_takes_the_lean_transport(monkeypatch):
    for k in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(k, raising=False)
    assert _lean_url("http://127.0.0.1:8000/v1") is not None
    assert _lean_url("HTTP://gpu-node-3:8000/v1/") is not None
    for url in ("https://api.openai.com/v1", "http://u:p@h:1/v1", "http://h:1/v1?x=1", "http://h:99999/v1", "h:1"):
        assert _lean_url(url) is None, url
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert _lean_url("http://gpu-node-3:8000/v1") is None  # httpx would go through the proxy: so does the SDK path
    monkeypatch.setenv("NO_PROXY", "gpu-node-3")
    assert _lean_url("http://gpu-node-3:8000/v1") is not None


def test_the_lean_transport_is_used_for_http_and_sdk_on_request(raw):
    raw.default = {"send": reply(completion("hi"))}
    (r,), c = calls(ep(raw.base_url))
    assert r.text == "hi" and c._http is not None and c._http.opened == 1
    (r,), c = calls(ep(raw.base_url), transport="sdk")
    assert r.text == "hi" and c._http is None


# --------------------------------------------------------------------------------------------------------------------
# connections
# --------------------------------------------------------------------------------------------------------------------


def test_keep_alive_reuses_one_connection_for_sequential_calls(raw):
    raw.default = {"send": reply(completion("ok"))}
    rs, c = calls(ep(raw.base_url), n=5)
    assert [r.text for r in rs] == ["ok"] * 5
    assert raw.connections == 1 and c._http.opened == 1 and len(raw.requests) == 5


def test_concurrent_calls_open_one_connection_each_then_reuse_them(raw):
    raw.default = {"send": reply(completion("ok")), "delay_s": 0.2}

    async def go():
        c = ChatClient(ep(raw.base_url), asyncio.Semaphore(8))
        try:
            first = await asyncio.gather(*(c.chat(MSG) for _ in range(4)))
            second = await asyncio.gather(*(c.chat(MSG) for _ in range(4)))
            return first + second, c._http.opened
        finally:
            await c.close()

    rs, opened = asyncio.run(go())
    assert len(rs) == 8 and all(r.text == "ok" for r in rs)
    assert opened == 4 and raw.connections == 4


def test_request_head_and_body_are_those_the_sdk_sends(monkeypatch):
    """The same JSON body (bytes), route and Authorization header on both paths (FakeChatServer records them)."""
    monkeypatch.setenv("TRANSPORT_TEST_KEY", "sk-transport-0123456789")
    seen = {}

    async def go(cfg, transport):
        c = ChatClient(cfg, transport=transport)
        try:
            return await c.chat(MSG, tools=[{"type": "function", "function": {"name": "f"}}], max_tokens=9)
        finally:
            await c.close()

    for transport in ("auto", "sdk"):
        with FakeChatServer() as srv:
            srv.default("default", text("ok"))
            asyncio.run(go(ep(srv.base_url, api_key_env="TRANSPORT_TEST_KEY"), transport))
            seen[transport] = (srv.requests, srv.auth_headers)
    assert seen["auto"] == seen["sdk"]
    (_, body), auth = seen["auto"][0][0], seen["auto"][1][0]
    assert body["max_tokens"] == 9 and body["tools"][0]["function"]["name"] == "f"
    assert auth == "Bearer sk-transport-0123456789"


def test_http10_server_closing_after_each_reply(raw):
    raw.default = {"send": reply(completion("ok"), version="HTTP/1.0"), "close": True}
    rs, c = calls(ep(raw.base_url), n=3)
    assert [r.text for r in rs] == ["ok"] * 3 and c._http.opened == 3 and raw.connections == 3


def test_connection_close_header_is_honoured(raw):
    raw.default = {"send": reply(completion("ok"), headers=("Connection: close",))}
    rs, c = calls(ep(raw.base_url), n=3)
    assert [r.text for r in rs] == ["ok"] * 3 and c._http.opened == 3


def test_a_connection_the_server_closed_while_idle_is_not_reused(raw):
    raw.default = {"send": reply(completion("ok")), "idle_close": True}
    rs, c = calls(ep(raw.base_url, max_retries=0), n=3, pause_s=0.2)
    assert [r.text for r in rs] == ["ok"] * 3  # no fault: the closed connection was dropped before use
    assert all(r.usage.faults == {} for r in rs) and c._http.opened == 3


def test_a_reply_cut_short_is_a_connection_fault_and_retried(raw):
    full = reply(completion("ok"))
    raw.script({"send": full[: len(full) - 10], "close": True})
    raw.default = {"send": full}
    (r,), c = calls(ep(raw.base_url))
    assert r.text == "ok" and r.usage.faults == {"connection": 1} and r.usage.retries == 1


def test_garbage_instead_of_http_is_a_connection_fault(raw):
    raw.script({"send": b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "close": True})
    raw.default = {"send": reply(completion("ok"))}
    (r,), _ = calls(ep(raw.base_url))
    assert r.text == "ok" and r.usage.faults == {"connection": 1}


def test_a_refused_connection_is_a_connection_fault():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    (e,), _ = calls(ep(f"http://127.0.0.1:{port}/v1", max_retries=1))
    assert isinstance(e, ChatError) and e.kind == "connection" and e.usage.faults == {"connection": 2}


# --------------------------------------------------------------------------------------------------------------------
# bodies
# --------------------------------------------------------------------------------------------------------------------


def test_chunked_reply_with_extensions_and_trailers(raw):
    calls_ = [{"id": "c1", "type": "function", "function": {"name": "web_search", "arguments": '{"query": "q"}'}}]
    raw.default = {"send": chunked(completion(None, tool_calls=calls_))}
    rs, c = calls(ep(raw.base_url), n=2)
    assert rs[0].tool_calls == calls_ and rs[1].tool_calls == calls_
    assert c._http.opened == 1  # the connection stays usable after a chunked reply


def test_gzip_reply(raw):
    body = gzip.compress(completion("squeezed"))
    raw.default = {"send": reply(body, headers=("Content-Encoding: gzip",))}
    (r,), _ = calls(ep(raw.base_url))
    assert r.text == "squeezed"


def test_deflate_reply_and_an_unknown_encoding(raw):
    raw.script({"send": reply(zlib.compress(completion("deflated")), headers=("Content-Encoding: deflate",))})
    raw.script({"send": reply(completion("x"), headers=("Content-Encoding: br",))})
    raw.default = {"send": reply(completion("plain"))}
    rs, _ = calls(ep(raw.base_url), n=2)
    assert rs[0].text == "deflated" and rs[0].usage.faults == {}
    assert rs[1].text == "plain" and rs[1].usage.faults == {"connection": 1}  # br is not decoded: a fault, retried


def test_reply_without_length_ends_at_close(raw):
    body = completion("till eof")
    raw.default = {"send": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + body, "close": True}
    rs, c = calls(ep(raw.base_url), n=2)
    assert [r.text for r in rs] == ["till eof"] * 2 and c._http.opened == 2


def test_interim_100_continue_is_skipped(raw):
    raw.default = {"send": b"HTTP/1.1 100 Continue\r\n\r\n" + reply(completion("after"))}
    (r,), _ = calls(ep(raw.base_url))
    assert r.text == "after"


# --------------------------------------------------------------------------------------------------------------------
# status codes, Retry-After, timeouts
# --------------------------------------------------------------------------------------------------------------------


def test_429_with_retry_after_waits_then_succeeds(raw):
    err = json.dumps({"error": {"message": "slow down"}}).encode()
    raw.script({"send": reply(err, "429 Too Many Requests", ("Retry-After: 0.5",))})
    raw.default = {"send": reply(completion("ok"))}
    t0 = time.monotonic()
    (r,), c = calls(ep(raw.base_url, backoff_max_s=5.0))
    assert r.text == "ok" and r.usage.faults == {"rate_limit": 1} and time.monotonic() - t0 >= 0.5
    assert c._http.opened == 1  # the 429 reply left the connection usable


def test_retry_after_ms_and_5xx(raw):
    err = b'{"error": {"message": "overloaded"}}'
    raw.script({"send": reply(err, "503 Service Unavailable", ("retry-after-ms: 400",))})
    raw.default = {"send": reply(completion("ok"))}
    t0 = time.monotonic()
    (r,), _ = calls(ep(raw.base_url, backoff_max_s=5.0))
    assert r.usage.faults == {"server_error": 1} and time.monotonic() - t0 >= 0.4


def test_4xx_is_final_and_worded_like_the_sdk(raw):
    raw.default = {"send": reply(b'{"object": "error", "message": "no such model m"}', "404 Not Found")}
    (e,), _ = calls(ep(raw.base_url))
    assert isinstance(e, ChatError) and e.kind == "status" and len(raw.requests) == 1
    assert str(e) == f"status: HTTP 404 from {raw.base_url}: Error code: 404 - no such model m"


def test_context_length_400_is_recognised(raw):
    msg = b'{"object": "error", "message": "This model\'s maximum context length is 4096 tokens."}'
    raw.default = {"send": reply(msg, "400 Bad Request")}
    (e,), _ = calls(ep(raw.base_url))
    assert e.kind == "context_length"


def test_a_timeout_drops_the_connection_so_a_late_reply_is_never_read_as_the_next_one(raw):
    raw.script({"send": reply(completion("too late")), "delay_s": 1.0})
    raw.default = {"send": reply(completion("fresh"))}
    t0 = time.monotonic()
    (r,), c = calls(ep(raw.base_url, timeout_s=0.3, max_retries=1))
    assert r.text == "fresh" and r.usage.faults == {"timeout": 1} and time.monotonic() - t0 < 1.0
    assert c._http.opened == 2


def test_the_overall_deadline_holds_on_the_lean_transport(raw):
    raw.default = {"send": reply(completion("never")), "delay_s": 3.0}
    t0 = time.monotonic()
    (e,), _ = calls(ep(raw.base_url, timeout_s=0.4, max_retries=50), deadline_s=1.2)
    assert e.kind == "deadline" and time.monotonic() - t0 < 2.0 and e.usage.faults["timeout"] >= 2


def test_a_redirect_hands_the_endpoint_to_the_sdk_client(raw):
    """httpx follows redirects; the lean transport does not: on a 3xx the SDK client re-sends the call (and every
    later one)."""
    target = raw.base_url.replace("/v1", "/v2") + "/chat/completions"
    redirect = {"send": reply(b"", "307 Temporary Redirect", (f"Location: {target}",))}
    raw.script(redirect, redirect)  # the lean transport's try, then the SDK's (which follows it)
    raw.default = {"send": reply(completion("moved"))}
    rs, c = calls(ep(raw.base_url), n=2)
    assert [r.text for r in rs] == ["moved"] * 2 and c._http is None
    heads = [h.split(b"\r\n")[0] for h, _ in raw.requests]
    assert heads == [b"POST /v1/chat/completions HTTP/1.1"] * 2 + [b"POST /v2/chat/completions HTTP/1.1"] + [
        b"POST /v1/chat/completions HTTP/1.1"
    ]
    assert b"x-stainless" not in raw.requests[0][0].lower() and b"x-stainless" in raw.requests[1][0].lower()


# --------------------------------------------------------------------------------------------------------------------
# parity with the SDK path
# --------------------------------------------------------------------------------------------------------------------

_WEIRD = [
    completion("plain"),
    completion(None, tool_calls=[{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]),
    completion(None, tool_calls=[{"type": "function", "function": {"name": "f"}}]),  # no id, no arguments
    completion(None, tool_calls=[{"id": "1", "type": "custom", "custom": {"name": "x", "input": "{}"}}]),
    completion(None, tool_calls="zz"),
    completion([{"type": "text", "text": "parts"}]),
    completion("u", usage={"prompt_tokens": 40.0, "completion_tokens": "7"}),
    completion("u", usage="none"),
    json.dumps({"choices": [{"message": {"content": "no usage"}, "finish_reason": 3}]}).encode(),
]


@pytest.mark.parametrize("i", range(len(_WEIRD)))
def test_the_same_reply_reads_the_same_on_both_transports(i):
    got = {}
    for transport in ("auto", "sdk"):
        with FakeChatServer() as srv:
            srv.script("default", Reply(raw_body=_WEIRD[i].decode()))
            (r,), _ = calls(ep(srv.base_url), transport=transport)
            got[transport] = r
    assert got["auto"].text == got["sdk"].text and got["auto"].tool_calls == got["sdk"].tool_calls
    assert got["auto"].finish_reason == got["sdk"].finish_reason
    a, s = got["auto"].usage, got["sdk"].usage
    assert (a.prompt_tokens, a.completion_tokens, a.faults, a.calls) == (
        s.prompt_tokens,
        s.completion_tokens,
        s.faults,
        s.calls,
    )


@pytest.mark.parametrize("transport", ["auto", "sdk"])
def test_faults_read_the_same_on_both_transports(transport):
    with FakeChatServer() as srv:
        srv.script("default", fault_500(), fault_429(retry_after=0.01), malformed(), tool_call("f", {"a": 1}))
        (r,), _ = calls(ep(srv.base_url, max_retries=3), transport=transport)
    assert r.usage.faults == {"server_error": 1, "rate_limit": 1, "malformed": 1} and r.usage.retries == 3
    assert r.tool_calls[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


@pytest.mark.parametrize("transport", ["auto", "sdk"])
@pytest.mark.parametrize(
    "body",
    [
        {"choices": "abc"},
        {"choices": ["x"]},
        {"choices": [{"message": "hi"}]},
        {"choices": [{"message": {"content": "a", "tool_calls": [{"id": "1", "function": "zz"}]}}]},
    ],
)
def test_structurally_broken_replies_are_malformed_on_both_transports(transport, body):
    with FakeChatServer() as srv:
        srv.script("default", Reply(raw_body=json.dumps(body)), text("ok"))
        (r,), _ = calls(ep(srv.base_url), transport=transport)
    assert r.text == "ok" and r.usage.faults == {"malformed": 1}


def test_oversized_bodies_are_refused_not_buffered(raw, monkeypatch):
    """A hostile endpoint: a huge Content-Length, a gzip bomb, an endless chunked stream. Each is a connection fault
    (retried), never a reply read into memory; the bound is lowered here so the test sends kilobytes, not 64 MiB."""
    import collect.llm as llm

    monkeypatch.setattr(llm, "_MAX_BODY", 4096)
    bomb = gzip.compress(b"{" + b" " * 100_000 + b"}")  # ~100 KB of JSON whitespace in a few hundred bytes
    raw.script({"send": b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n", "close": True})
    raw.script({"send": reply(bomb, headers=("Content-Encoding: gzip",))})
    raw.script({"send": chunked(b"x" * 8000), "close": True})
    raw.default = {"send": reply(completion("ok"))}
    (r,), _ = calls(ep(raw.base_url, max_retries=3))
    assert len(bomb) < 4096 and r.text == "ok" and r.usage.faults == {"connection": 3}


# --------------------------------------------------------------------------------------------------------------------
# issue 52, classes 4 and 5: 200 bodies the JSON decoder chokes on, or that are not strict JSON
# --------------------------------------------------------------------------------------------------------------------

_DEEP = 100_000


def _with_usage(usage_json: bytes) -> bytes:
    """A completion whose usage object is the raw JSON text given (numbers json.dumps cannot write)."""
    return completion("x", usage={"prompt_tokens": 1}).replace(b'{"prompt_tokens": 1}', usage_json)


_CHOKING = {
    "nested_100000_deep": b'{"choices": ' + b"[" * _DEEP + b"]" * _DEEP + b"}",  # RecursionError
    "usage_5000_digits": _with_usage(b'{"prompt_tokens": ' + b"9" * 5000 + b"}"),  # ValueError: int-string limit
    "content_a_number": completion(5),  # TypeError downstream (len, strip)
    "content_an_object": completion({"text": "x"}),
    "usage_nan": _with_usage(b'{"prompt_tokens": NaN, "completion_tokens": 1}'),  # not JSON
    "usage_1e400": _with_usage(b'{"prompt_tokens": 1e400}'),  # overflows to inf
    "arguments_object_with_infinity": completion(
        None, tool_calls=[{"id": "1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
    ).replace(b'{"a": 1}', b'{"a": Infinity}'),
}


@pytest.mark.parametrize("transport", ["auto", "sdk"])
@pytest.mark.parametrize("name", list(_CHOKING))
def test_a_200_body_the_decoder_chokes_on_is_malformed_and_retried(raw, transport, name):
    raw.script({"send": reply(_CHOKING[name])})
    raw.default = {"send": reply(completion("ok"))}
    (r,), _ = calls(ep(raw.base_url), transport=transport)  # before: the exception escaped chat() (no retry)
    assert not isinstance(r, ChatError), r
    assert r.text == "ok" and r.usage.faults == {"malformed": 1} and r.usage.retries == 1


@pytest.mark.parametrize("transport", ["auto", "sdk"])
def test_a_body_that_keeps_choking_ends_as_a_malformed_chat_error(raw, transport):
    raw.default = {"send": reply(_CHOKING["usage_5000_digits"])}
    (r,), _ = calls(ep(raw.base_url, max_retries=2), transport=transport)
    assert isinstance(r, ChatError) and r.kind == "malformed" and r.usage.faults == {"malformed": 3}


def test_content_as_text_parts_reads_as_their_text(raw):
    parts = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "one "}]
    parts.append({"type": "text", "text": "two"})
    raw.script({"send": reply(completion(parts))})
    (r,), _ = calls(ep(raw.base_url))
    assert r.text == "one two" and r.usage.faults == {}


@pytest.mark.parametrize("transport", ["auto", "sdk"])
def test_an_error_body_nested_deep_is_still_the_status_error(raw, transport):
    deep = b'{"error": ' + b"[" * _DEEP + b"]" * _DEEP + b"}"
    raw.default = {"send": reply(deep, status="400 Bad Request")}
    (r,), _ = calls(ep(raw.base_url), transport=transport)  # before (lean): RecursionError out of the status fault
    assert isinstance(r, ChatError) and r.kind == "status" and "HTTP 400" in str(r)
