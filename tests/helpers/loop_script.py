"""Scripted runs of the real loop (collect.loop.run_task with OpenAI roles) against tests/fakes.FakeChatServer:
the task, the need-parser / critic / answer-critic replies, and the canonical closure run recorded once per session
(tests/conftest.py: closure_run)."""

from __future__ import annotations

import asyncio
import json

from collect.config import EndpointConfig, RolesConfig, RuntimeConfig
from collect.ledger import Asset, TaskContext
from collect.llm import ClientPool
from collect.loop import ToolFailure, run_task
from collect.roles.factory import build_roles
from tests.fakes import FakeChatServer, FakeToolBox, text, tool_call

R0 = TaskContext(
    task_id="t-1",
    question="In which year was the company on the banner founded?",
    assets=(Asset("v1", "video", 120.0),),
)
NEEDS = [
    {"need": "company on the banner", "preferred_source": "subtitle", "need_role": "anchor", "query_focus": "banner"},
    {"need": "founding year", "preferred_source": "web", "depends_on": [0], "query_focus": "founded"},
]

# A task whose anchor need names a time window ("between 35 s and 50 s"): window_stats and window references.
R0_WINDOW = TaskContext(
    task_id="t-window",
    question="Between 35 s and 50 s of v1, a banner names a company. In which year was it founded?",
    assets=(Asset("v1", "video", 120.0),),
)
NEEDS_WINDOW = [
    {
        "need": "company on the banner",
        "preferred_source": "visual",
        "need_role": "anchor",
        "query_focus": "company on the banner between 35 s and 50 s",
    },
    {"need": "founding year", "preferred_source": "web", "depends_on": [0], "query_focus": "founded"},
]


def needs_reply(needs=NEEDS):
    return text(json.dumps({"needs": needs}))


def critic(verdict="INSUFFICIENT", updates=(), desc="still missing the founding year"):
    return text(
        json.dumps(
            {
                "verdict": verdict,
                "gap_diagnosis": {"gap_type": verdict.lower(), "description": desc},
                "updated_need_statuses": list(updates),
            }
        )
    )


def fill(i, value, tool="web_search"):
    return {"need_index": i, "status": "filled", "value": value, "filled_by": tool, "evidence": f"... {value} ..."}


def answer_critic(ok, hint=""):
    return text(json.dumps({"verdict": "PASS" if ok else "BLOCK", "revision_hint": hint}))


def script_anchor_then_year(srv, *planner_replies, anchor="Acme"):
    """Script a run that fills need 0 with `anchor` at the first tool call the critic sees and need 1 with 1999 at the
    second, then accepts "1999": the planner replies are the caller's (rejected ones never reach the critic)."""
    srv.script("planner", *planner_replies)
    srv.script("critic", critic(updates=[fill(0, anchor)]), critic("SUFFICIENT", [fill(1, "1999")]))
    srv.script("finalizer", text("1999"))
    srv.script("answer_critic", answer_critic(True))


def run(srv, r0=R0, toolbox=None, **cfg):
    async def go():
        endpoints = {"fake": EndpointConfig(base_url=srv.base_url, model="fake-model", max_retries=0, timeout_s=10)}
        pool = ClientPool(endpoints, concurrency=4)
        roles_cfg = RolesConfig.from_dict({r: "fake" for r in RolesConfig().as_dict()})
        roles = build_roles(r0, roles_cfg, endpoints, pool)
        try:
            return await run_task(r0, roles, toolbox or FakeToolBox(ToolFailure), RuntimeConfig(**cfg))
        finally:
            await pool.close()

    rec = asyncio.run(go())
    assert srv.misses == [], f"under-scripted roles: {srv.misses}"
    return rec


def all_events(rec):
    evs = list(rec["initial_events"])
    for s in rec["steps"]:
        evs += s["events"]
    return evs + rec["final_events"]


def kinds(rec):
    return [e["kind"] for e in all_events(rec)]


def closure_record() -> dict:
    """The canonical scripted closure: anchor by subtitle_grounding, one garbage planner reply (a ModelError step),
    the fact by web_search, finish -> accepted with answer 1999."""
    with FakeChatServer() as srv:
        srv.script("need_parser", needs_reply())
        srv.script(
            "planner",
            tool_call("subtitle_grounding", {"query": "banner", "asset_id": "v1", "need_index": 0}),
            text("garbage"),
            tool_call("web_search", {"query": "Acme founded", "need_index": 1}),
            tool_call("finish", {"answer": "1999"}),
        )
        srv.script(
            "critic", critic(updates=[fill(0, "Acme", "subtitle_grounding")]), critic("SUFFICIENT", [fill(1, "1999")])
        )
        srv.script("finalizer", text("1999"))
        srv.script("answer_critic", answer_critic(True))
        return run(srv)


def fake_checkpoint(d):
    """A folder with a save_pretrained checkpoint's layout (serve.checks.checkpoint_problem) and no usable weights:
    for tests whose server is replaced."""
    from pathlib import Path

    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "tokenizer.json"):
        (d / name).write_text("{}")
    (d / "model.safetensors").write_bytes(b"")
    return d
