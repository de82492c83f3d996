"""The chat client against the scripted fake server: retries, Retry-After, give-up, timeout, concurrency, usage."""

from __future__ import annotations

import asyncio
import time

import pytest

from collect.config import EndpointConfig
from collect.llm import ChatClient, ChatError, ClientPool
from tests.fakes import FakeChatServer, fault_429, fault_500, hang, malformed, text

MSG = [{"role": "system", "content": "# Role: planner\nhi"}, {"role": "user", "content": "one two three"}]


def cfg(srv, **kw):
    base = {"base_url": srv.base_url, "model": "m", "max_retries": 3, "timeout_s": 5, "backoff_base_s": 0.01}
    return EndpointConfig(**{**base, **kw})


def call(c: EndpointConfig, n: int = 1, concurrency: int = 8):
    async def go():
        pool = ClientPool({"e": c}, concurrency)
        try:
            return await asyncio.gather(*[pool.client("e").chat(MSG) for _ in range(n)])
        finally:
            await pool.close()

    return asyncio.run(go())


@pytest.fixture
def srv():
    with FakeChatServer() as s:
        yield s


def test_retries_on_500_then_succeeds_and_counts_the_fault(srv):
    srv.script("planner", fault_500(), fault_500(), text("ok"))
    (r,) = call(cfg(srv))
    assert r.text == "ok" and r.usage.retries == 2 and r.usage.faults == {"server_error": 2}
    assert len(srv.requests) == 3


def test_429_honours_retry_after(srv):
    srv.script("planner", fault_429(retry_after=0.6), text("ok"))
    t0 = time.monotonic()
    (r,) = call(cfg(srv))
    assert time.monotonic() - t0 >= 0.6 and r.usage.faults == {"rate_limit": 1} and r.text == "ok"


def test_gives_up_after_max_retries(srv):
    srv.default("planner", fault_500())
    with pytest.raises(ChatError) as e:
        call(cfg(srv, max_retries=2))
    assert e.value.kind == "server_error" and e.value.usage.faults == {"server_error": 3}
    assert len(srv.requests) == 3


def test_non_retryable_status_raises_at_once(srv):
    with pytest.raises(ChatError, match="HTTP 400"):
        call(cfg(srv))  # nothing scripted: the fake answers 400
    assert len(srv.requests) == 1


def test_hanging_call_times_out(srv):
    # The server answers after 30 s; the client's 0.4 s timeout must end the call long before (the margin is wide
    # so a loaded CI machine cannot fail it: a 3 s hang vs a 2.5 s bound failed beside a training job at 3.7 s).
    srv.script("planner", hang(30.0))
    t0 = time.monotonic()
    with pytest.raises(ChatError) as e:
        call(cfg(srv, timeout_s=0.4, max_retries=0))
    assert e.value.kind == "timeout" and time.monotonic() - t0 < 15.0


def test_malformed_body_is_retried_as_malformed(srv):
    srv.script("planner", malformed(), text("ok"))
    (r,) = call(cfg(srv))
    assert r.text == "ok" and r.usage.faults == {"malformed": 1}


def test_concurrency_limit_is_respected(srv):
    srv.default("planner", text("ok", delay_s=0.2))
    rs = call(cfg(srv), n=6, concurrency=2)
    assert len(rs) == 6 and srv.max_in_flight == 2


def test_usage_tokens_latency_and_cost_are_recorded(srv):
    srv.script("planner", text("ok", delay_s=0.1, prompt_tokens=1000, completion_tokens=500))
    (r,) = call(cfg(srv, price_in_per_mtok=2.0, price_out_per_mtok=10.0))
    u = r.usage
    assert (u.prompt_tokens, u.completion_tokens, u.calls, u.model) == (1000, 500, 1, "m")
    assert u.latency_s >= 0.1 and u.cost_usd == pytest.approx((1000 * 2 + 500 * 10) / 1e6)


def test_native_tool_calls_come_back_in_openai_shape(srv):
    from tests.fakes import tool_call

    srv.script("planner", tool_call("web_search", {"query": "q"}))
    (r,) = call(cfg(srv))
    assert r.tool_calls[0]["function"] == {"name": "web_search", "arguments": '{"query": "q"}'}


def test_key_is_not_in_any_repr(monkeypatch, srv):
    monkeypatch.setenv("MY_KEY", "sk-very-secret")
    c = cfg(srv, api_key_env="MY_KEY")

    async def go():
        client = ChatClient(c)
        s = repr(client) + repr(c) + str(client.__dict__.get("cfg"))
        await client.close()
        return s

    assert "sk-very-secret" not in asyncio.run(go())
