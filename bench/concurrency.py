"""Collect concurrency: N embedded tasks against a loopback endpoint with a fixed 100 ms latency per call.

The planner makes a real chat call per decision through collect.llm (the real openai client, over HTTP, through the
shared concurrency limit) to a local server that sleeps 100 ms, then acts as the offline teacher, so the run has the
real runtime's per-step work plus a known amount of waiting. Efficiency = (calls x latency / concurrency) / wall."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from collect.config import EndpointConfig, RuntimeConfig
from collect.llm import ClientPool
from collect.loop import run_task
from collect.teacher import make_teacher_roles
from collect.tools import ToolBox, ToolsConfig
from collect.world import load_world


def _serve(latency_s: float, port_q) -> None:
    """The endpoint runs in its own process, as a real inference server would (not sharing the runtime's GIL)."""

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real inference servers do
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(latency_s)
            body = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "latency",
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    class Server(ThreadingHTTPServer):
        request_queue_size = 512  # listen() backlog: 32 concurrent clients must not be refused
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), H)
    port_q.put(httpd.server_address[1])
    httpd.serve_forever()


class LatencyServer:
    def __init__(self, latency_s: float):
        ctx = multiprocessing.get_context("spawn")
        self.q = ctx.Queue()
        self.proc = ctx.Process(target=_serve, args=(latency_s, self.q), daemon=True)

    def __enter__(self):
        self.proc.start()
        return f"http://127.0.0.1:{self.q.get(timeout=60)}/v1"

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.join(timeout=10)


class TimedToolBox(ToolBox):
    """Records the wall time spent inside tools (sandboxed code runs are real subprocesses)."""

    spent = 0.0

    async def execute(self, name, arguments):
        t0 = time.perf_counter()
        try:
            return await super().execute(name, arguments)
        finally:
            TimedToolBox.spent += time.perf_counter() - t0


class RemoteTeacherPlanner:
    """One real HTTP chat call per decision (its reply is discarded), then the teacher's decision."""

    def __init__(self, inner, client):
        self.inner, self.client, self.calls = inner, client, 0

    async def decide(self, messages, tools, *, r0, ledger):
        await self.client.chat(messages, tools=tools)
        self.calls += 1
        return await self.inner.decide(messages, tools, r0=r0, ledger=ledger)


async def _run(tasks, corpus, base_url: str, concurrency: int) -> tuple[int, float]:
    pool = ClientPool({"lat": EndpointConfig(base_url=base_url, model="latency", max_retries=0)}, concurrency)
    cfg = RuntimeConfig(concurrency=concurrency)
    sem = asyncio.Semaphore(concurrency)
    planners = []

    async def one(task):
        async with sem:
            roles = make_teacher_roles(task)
            p = RemoteTeacherPlanner(roles.planner, pool.client("lat"))
            planners.append(p)
            r0 = task.to_context(cfg.budget())
            await run_task(
                task, dataclasses.replace(roles, planner=p), TimedToolBox(task, r0, ToolsConfig(), corpus=corpus), cfg
            )

    TimedToolBox.spent = 0.0
    t0 = time.perf_counter()
    await asyncio.gather(*(one(t) for t in tasks))
    wall = time.perf_counter() - t0
    await pool.close()
    return sum(p.calls for p in planners), wall, TimedToolBox.spent


def run(n_tasks: int = 200, latency_s: float = 0.1, levels=(1, 8, 32)) -> list[dict]:
    world = load_world(seed=0)
    tasks = world.tasks[:n_tasks]
    results = {}
    with LatencyServer(latency_s) as url:
        for c in levels:
            calls, wall, tool_s = asyncio.run(_run(tasks, world.corpus, url, c))
            results[c] = {
                "calls": calls,
                "wall_s": round(wall, 2),
                "tool_wall_s_summed": round(tool_s, 2),
                "efficiency": round(calls * latency_s / c / wall, 3),
                # the same, counting time inside tools (sandbox subprocesses, BM25) as useful work, not overhead
                "efficiency_incl_tool_time": round((calls * latency_s + tool_s) / c / wall, 3),
            }
    top = max(levels)
    return [
        {
            "name": f"collect_concurrency_{c}",
            "figure": r["efficiency"],
            "unit": "efficiency (calls x latency / concurrency / wall)",
            "target": ">= 0.85" if c == top else "report",
            "met": (r["efficiency"] >= 0.85) if c == top else None,
            "inputs": {"tasks": n_tasks, "latency_s": latency_s, "concurrency": c},
            "extra": r,
        }
        for c, r in results.items()
    ]
