"""Collect concurrency: embedded tasks against a loopback endpoint (its own process) with a fixed latency per call.

The planner makes a real chat call per decision through collect.llm (the real openai client, over HTTP, through the
shared concurrency limit) to a local server that sleeps `latency`, then acts as the offline teacher, so the run has
the real runtime's per-step work plus a known amount of waiting. Measured in steady state for a bounded time (see
`steady_state`), with the slots in one process or spread over worker processes (one per core)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import time

from collect.config import EndpointConfig, RuntimeConfig, usable_cores
from collect.llm import ClientPool
from collect.loop import run_task
from collect.teacher import make_teacher_roles
from collect.tools import ToolBox, ToolsConfig, code_executor
from collect.world import load_world

_BODY = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "latency",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()
_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(_BODY) + _BODY


def _serve(latency_s: float, port_q) -> None:
    """The endpoint runs in its own process, as a real inference server would (not sharing the runtime's GIL). It is
    an asyncio server, as inference servers are: 256 connections waiting 1 s each cost it almost nothing. (A
    thread-per-connection http.server answered a 1 s call after 2.5 s at 256 connections on 2 loaded cores: the
    benchmark measured its GIL, not the runtime.) Keep-alive HTTP/1.1, one response per request."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                await asyncio.sleep(latency_s)
                writer.write(_RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port_q.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


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

    async def decide(self, messages, tools, *, r0, ledger, **sampling):
        await self.client.chat(messages, tools=tools)
        self.calls += 1
        return await self.inner.decide(messages, tools, r0=r0, ledger=ledger, **sampling)


async def _run(tasks, corpus, base_url: str, concurrency: int) -> tuple[int, float]:
    """Every task once, at most `concurrency` at a time, in this process's event loop (profiling entry point)."""
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


# --------------------------------------------------------------------------------------------------------------------
# Steady-state efficiency, bounded in time. `concurrency` slots each run embedded tasks back to back (a closed loop:
# a slot starts its next task when one ends, as a long collect run does) for `duration_s`; the slots are spread over
# `workers` processes, each with its own event loop and its share of the slots, exactly as collect.run splits
# runtime.concurrency over its workers. Counted: planner calls that complete inside the window [warm_s, duration_s]
# (connection set-up and process start-up are outside it). Efficiency = calls x latency / (concurrency x window):
# 1.0 when every slot always has a call in flight. CPU per call = the CPU of the worker processes and of their sandbox
# launchers inside the window / calls (the sandboxed code itself is not runtime CPU).
# --------------------------------------------------------------------------------------------------------------------


class _Timed(ToolBox):
    def __init__(self, *a, spent: list, **kw):
        super().__init__(*a, **kw)
        self._spent = spent

    async def execute(self, name, arguments):
        t0 = time.monotonic()
        try:
            return await super().execute(name, arguments)
        finally:
            self._spent.append((time.monotonic(), time.monotonic() - t0))


class _CountingPlanner:
    def __init__(self, inner, client, done: list):
        self.inner, self.client, self.done = inner, client, done

    async def decide(self, messages, tools, *, r0, ledger, **sampling):
        t0 = time.monotonic()
        await self.client.chat(messages, tools=tools)
        t1 = time.monotonic()
        self.done.append((t1, t1 - t0))
        return await self.inner.decide(messages, tools, r0=r0, ledger=ledger, **sampling)


def _launcher_cpu() -> float | None:
    """CPU seconds of this process's sandbox launcher (collect/tools/sandbox_launcher.py), which forks the code
    sandboxes on the runtime's behalf: counted as runtime CPU (the sandboxes' own CPU is not)."""
    la = code_executor._launcher
    if la is None or la.owner != os.getpid():
        return None
    try:
        fields = open(f"/proc/{la.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _slot_worker(base_url, latency_s, concurrency, first_slot, n_tasks, start_q, result_q) -> None:
    world = load_world(seed=0)
    tasks = world.tasks[:n_tasks] if n_tasks else world.tasks
    result_q.put(("ready", None))
    t0, warm_s, duration_s = start_q.get()

    async def main():
        pool = ClientPool({"lat": EndpointConfig(base_url=base_url, model="latency", max_retries=0)}, concurrency)
        cfg = RuntimeConfig(concurrency=concurrency)
        done: list[tuple[float, float]] = []
        spent: list[tuple[float, float]] = []
        started = [0]
        stop = [False]

        async def slot(i: int):
            k = (first_slot + i) * 7  # slots start at different tasks, then take them in order
            while not stop[0]:
                task = tasks[k % len(tasks)]
                k += 1
                roles = make_teacher_roles(task)
                planner = _CountingPlanner(roles.planner, pool.client("lat"), done)
                r0 = task.to_context(cfg.budget())
                box = _Timed(task, r0, ToolsConfig(), corpus=world.corpus, spent=spent)
                started[0] += 1
                await run_task(task, dataclasses.replace(roles, planner=planner), box, cfg)

        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        slots = [asyncio.create_task(slot(i)) for i in range(concurrency)]
        await asyncio.sleep(max(0.0, t0 + warm_s - time.monotonic()))
        cpu0, n0, l0 = time.process_time(), len(done), _launcher_cpu()
        await asyncio.sleep(max(0.0, t0 + duration_s - time.monotonic()))
        cpu1, n1, l1 = time.process_time(), len(done), _launcher_cpu()
        stop[0] = True
        for s in slots:
            s.cancel()
        await asyncio.wait(slots, timeout=30)
        await pool.close()
        lo, hi = t0 + warm_s, t0 + duration_s
        tool_s = sum(d for t, d in spent if lo <= t <= hi)
        call_s = sum(d for t, d in done[n0:n1])
        return {
            "calls": n1 - n0,
            "call_s": call_s,
            "cpu_s": cpu1 - cpu0 + (l1 - l0 if l0 is not None and l1 is not None else 0.0),
            "launcher_cpu_s": l1 - l0 if l0 is not None and l1 is not None else None,
            "tool_s": tool_s,
            "tasks_started": started[0],
        }

    try:
        result_q.put(("done", asyncio.run(main())))
    except BaseException:
        import traceback

        result_q.put(("error", traceback.format_exc()))
        raise


def steady_state(
    base_url: str, latency_s: float, concurrency: int, workers: int, duration_s: float, warm_s: float, n_tasks=None
) -> dict:
    ctx = multiprocessing.get_context("spawn")
    result_q = ctx.Queue()
    starts, procs = [], []
    t_spawn = time.monotonic()
    first = 0
    for w in range(workers):
        share = concurrency // workers + (w < concurrency % workers)
        q = ctx.Queue()
        p = ctx.Process(
            target=_slot_worker, args=(base_url, latency_s, share, first, n_tasks, q, result_q), daemon=True
        )
        p.start()
        starts.append(q)
        procs.append(p)
        first += share
    for _ in procs:
        assert result_q.get(timeout=300)[0] == "ready"
    startup_s = time.monotonic() - t_spawn
    t0 = time.monotonic() + 0.5
    for q in starts:
        q.put((t0, warm_s, duration_s))
    parts = []
    for _ in procs:
        kind, part = result_q.get(timeout=duration_s + 300)
        if kind != "done":
            raise RuntimeError(f"a benchmark worker failed:\n{part}")
        parts.append(part)
    for p in procs:
        p.join(timeout=30)
    window = duration_s - warm_s
    calls = sum(x["calls"] for x in parts)
    cpu = sum(x["cpu_s"] for x in parts)
    tool_s = sum(x["tool_s"] for x in parts)
    call_s = sum(x["call_s"] for x in parts)
    return {
        "workers": workers,
        "calls_in_window": calls,
        "window_s": window,
        "efficiency": round(calls * latency_s / (concurrency * window), 3),
        "efficiency_incl_tool_time": round((calls * latency_s + tool_s) / (concurrency * window), 3),
        "cpu_ms_per_call": round(1000 * cpu / calls, 2) if calls else None,  # worker processes + their launchers
        "launcher_cpu_ms_per_call": round(1000 * sum(x["launcher_cpu_s"] or 0.0 for x in parts) / calls, 2)
        if calls
        else None,
        # the latency a call took as seen by the runtime (endpoint + HTTP + waiting for this process to be scheduled)
        "observed_call_ms": round(1000 * call_s / calls, 1) if calls else None,
        "share_of_slot_time_in_calls": round(call_s / (concurrency * window), 3),
        "cpu_cores_busy": round(cpu / window, 2),
        # the CPU the runtime would need to keep every slot's call in flight (efficiency 1) at this CPU per call: more
        # than the cores it gets (other processes share them) caps the efficiency at about cores_busy / this
        "cores_needed_at_efficiency_1": round(concurrency / latency_s * cpu / calls, 2) if calls else None,
        "tool_wall_s_summed": round(tool_s, 2),
        "startup_s": round(startup_s, 1),
        "tasks_started": sum(x["tasks_started"] for x in parts),
    }


def auto_workers() -> int:
    return usable_cores()


# (concurrency, endpoint latency, duration, warm-up): 32 slots on a 100 ms endpoint, 256 on a 1 s endpoint
LEVELS = ((32, 0.1, 12.0, 2.0), (256, 1.0, 25.0, 5.0))


def run(levels=LEVELS, n_tasks=None) -> list[dict]:
    auto = auto_workers()
    out = []
    for conc, latency, duration, warm in levels:
        with LatencyServer(latency) as url:
            for label, w in (("1", 1), ("auto", auto)):
                r = steady_state(url, latency, conc, w, duration, warm, n_tasks)
                name = f"collect_efficiency_c{conc}_{int(latency * 1000)}ms_workers_{label}"
                out.append(
                    {
                        "name": name,
                        "figure": r["efficiency"],
                        "unit": "efficiency (calls x latency / concurrency / window)",
                        "target": ">= 0.85" if label == "auto" else "report",
                        "met": (r["efficiency"] >= 0.85) if label == "auto" else None,
                        "inputs": {"concurrency": conc, "latency_s": latency, "duration_s": duration, "warm_s": warm},
                        "extra": r,
                    }
                )
                if label == "1":
                    out.append(
                        {
                            "name": f"collect_cpu_per_call_c{conc}",
                            "figure": r["cpu_ms_per_call"],
                            "unit": "ms of runtime CPU per planner call (one process + its sandbox launcher)",
                            "target": "report",
                            "met": None,
                            "inputs": {"concurrency": conc, "latency_s": latency, "workers": 1},
                            "extra": {"cpu_cores_busy": r["cpu_cores_busy"]},
                        }
                    )
    return out
