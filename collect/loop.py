"""The runtime loop (v3 Algorithm 1) for the arms `ledger` (the method), `react` and `memory`; returns a trajectory.

Algorithm 1 -> this code (ledger arm):
  S_0 <- needs(R0)                      need_parser.parse -> NeedsDeclared -> reduce
  for t = 1..T:                         `while ledger.steps < T` (every planner call is one step, errors included)
    if not ready(S) and no a with can_advance(a, R0, S): return insufficient
                                        `any_action_can_advance` before the planner call -> Stop(insufficient)
    d_t <- digest(R0, S_t); a_t <- decide(d_t; A(R0))
                                        render_planner_messages(r0, ledger, latest observation) -> planner.decide ->
                                        parse_action + validate_action; a model error -> ModelError, next step
    if a_t = finish:
      if not ready(S_t): S <- S (+) blocked-finish diagnosis          FinishBlocked (gate; no finalizer call)
      else y <- finalize(S_t); if answer_critic(y) = PASS: return y  AnswerAccepted (accepted | repaired)
           else S <- S (+) blocked-finish diagnosis                   FinishBlocked(hint)
    else o_t <- execute(a_t); v_t <- critic(d_t, o_t); S <- S (+) event(o_t, v_t)
                                        execute -> critic.judge -> ObservationCommitted; tool exception -> ToolError
  return budget_exhausted               Stop(budget_exhausted)
Departures from the textbook, all explicit:
  * Forced answer: a finish attempted once blocked_finishes >= max_revisions skips gate and answer critic; the
    finalizer drafts from the ledger and AnswerAccepted(forced=True) ends the run (outcome `forced`).
  * The latest raw observation (or the error/blocked-finish note) is shown to the planner once, truncated; the
    digest is the planner's only memory in the ledger arm.
  * insufficient / budget_exhausted end with answer None here; the collect engine (collect/run.py) then reports the
    answer "insufficient" for both, as Algorithm 1 does (lines 17 and 20), and keeps the outcome labels apart.
Arms over the same tools and budget:
  react:  the planner sees R0 + its own assistant tool_call / tool messages (raw observations accumulate); finish
          returns the planner's answer at once (no gate, no finalizer, no answer critic, no insufficient stop). The
          need parser and critic still run so the ledger is recorded for audit, but the planner never sees them.
  memory: the planner sees R0 + a rolling summary (summarizer after each observation, capped at the length of the
          rendered digest at that step) + the latest observation; critic, gate and stopping as in `ledger`.
Model errors (unparseable reply, unknown tool, bad arguments, unreadable critic output) and tool failures become
events and the loop goes on; anything else (transport errors after retries, bugs) raises. With
RuntimeConfig.rejection_temperature > 0, the planner calls after a rejected reply (until one is valid) are sampled at
that temperature, seeded by (task, step), instead of repeating the planner's own (greedy) decoding; off by default.
With RuntimeConfig.reject_futile_calls, a tool call that `can_advance` says cannot move the ledger (a repeat of a call
that made no progress, a need that is not actionable) is rejected the same way (ModelError futile_call); off by
default.
With RuntimeConfig.value_refs (ledger arm), the planner prompt offers value references: "{need:K}" in a query stands
for need K's filled value (in code for its Python literal) and is substituted (collect.actions.resolve_value_refs)
before validation, the futile-call check, the tool and the critic; the step keeps the action as written and adds
`resolved_arguments`. Off by default. RuntimeConfig.window_refs ("{window:K}" as a time_range) and
RuntimeConfig.focus_refs ("{focus:K}" in a query for need K's query_focus, resolved in the same pass as "{need:K}":
collect.actions.resolve_text_refs) work the same way; both off by default.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from collect import bounds
from collect.actions import ActionError, parse_action, resolve_refs, validate_action
from collect.config import RuntimeConfig
from collect.ledger import (
    INSUFFICIENT,
    AnswerAccepted,
    FinishBlocked,
    Ledger,
    ModelError,
    NeedsDeclared,
    ObservationCommitted,
    Stop,
    TaskContext,
    ToolError,
    any_action_can_advance,
    canonical_args,
    event_to_dict,
    futile_reason,
    infer_target,
    initial_ledger,
    plain,
    ready,
    reduce,
    render_digest,
    state_hash,
    useful_tools_exhausted,
)
from collect.llm import ChatError
from collect.roles import render
from collect.roles.base import Roles, Usage
from collect.roles.openai_roles import CRITIC_ERROR_GAP
from collect.tools import ToolFailure
from collect.trajectory import config_hash as hash_configs


def _task_parts(task_or_r0) -> tuple[TaskContext, str | None]:
    """(R0, gold answer or None) from a TaskContext or a task object with `to_context()` / `r0` and `answer`."""
    if isinstance(task_or_r0, TaskContext):
        return task_or_r0, None
    to_ctx = getattr(task_or_r0, "to_context", None) or getattr(task_or_r0, "r0", None)
    if callable(to_ctx):
        r0 = to_ctx()
    elif isinstance(to_ctx, TaskContext):
        r0 = to_ctx
    else:
        raise TypeError(f"run_task: expected a TaskContext or a task with to_context(), got {type(task_or_r0)}")
    gold = getattr(task_or_r0, "answer", None) or getattr(task_or_r0, "gold_answer", None)
    return r0, None if gold is None else str(gold)


def _blocked_reason(ledger: Ledger) -> str:
    parts = []
    ob = [n.index for n in ledger.open_blocking()]
    if ob:
        parts.append(f"blocking needs not filled: {ob}")
    empty = [s.need_index for s in ledger.slots if s.value is None]
    if empty and not ob:
        parts.append(f"empty slots for needs {empty}")
    uc = [c.need_index for c in ledger.unresolved_conflicts()]
    if uc:
        parts.append(f"unresolved conflicts on needs {uc}")
    return "finish blocked: the ledger is not ready (" + "; ".join(parts or ["no needs"]) + ")"


class _Run:
    """Mutable bookkeeping of one task run: the ledger, the recorded events and usage per role."""

    def __init__(self, r0: TaskContext, roles: Roles, cfg: RuntimeConfig):
        self.r0, self.roles, self.cfg = r0, roles, cfg
        self.ledger = initial_ledger()
        self.usage: dict[str, Usage] = {}
        self.step_events: list[dict] = []

    def apply(self, event) -> None:
        self.ledger = reduce(self.ledger, event)
        self.step_events.append(event_to_dict(event))

    def account(self, role: str, u: Usage) -> None:
        self.usage.setdefault(role, Usage(model=u.model)).add(u)


def resample_seed(task_id: str, t: int) -> int:
    """The seed of a re-sampled planner call: fixed by (task, step), so a rerun samples the same reply; 31 bits, which
    every OpenAI-compatible server accepts."""
    return int.from_bytes(hashlib.sha256(f"{task_id}/{t}".encode()).digest()[:4], "big") & 0x7FFFFFFF


async def run_task(
    task_or_r0, roles: Roles, toolbox, runtime_cfg: RuntimeConfig, *, config_hash: str | None = None
) -> dict:
    """Run one task to its outcome and return its trajectory record (see docs/trajectory.md).

    config_hash: the record's `config_hash`, written here only; the collect engine passes its whole recipe's hash
    (CollectConfig.hash(), the one in OUT/run_config.json). Default: a hash of the runtime config and role models."""
    cfg = runtime_cfg
    r0, gold = _task_parts(task_or_r0)
    r0 = replace(r0, budget=cfg.budget())  # the runtime config is the one source of the budget
    if cfg.arm == "memory" and roles.summarizer is None:
        raise ValueError(f"task {r0.task_id}: arm 'memory' needs roles.summarizer")
    run = _Run(r0, roles, cfg)
    T = cfg.max_steps
    max_obs = cfg.max_observation_chars
    lim = cfg.limits  # every role output is bounded and made UTF-8-safe before the runtime keeps it (bounds.py)

    # ---- S_0: needs --------------------------------------------------------------------------------------------
    np_messages = render.render_need_parser_messages(r0)
    needs, u = await roles.need_parser.parse(r0, np_messages)
    run.account("need_parser", u)
    needs = bounds.clean_needs(needs, lim)
    run.apply(NeedsDeclared(tuple(needs), unfillable_after=cfg.unfillable_after))
    initial_events, run.step_events = run.step_events, []
    needs_json = json.dumps([plain(n) for n in needs], ensure_ascii=False)

    tools = render.tools_for(r0, toolbox.schemas())
    latest: str | None = None  # shown once to the planner at the next step
    resample = False  # the last planner reply was rejected (RuntimeConfig.rejection_temperature)
    value_refs = cfg.value_refs and cfg.arm == "ledger"  # only the ledger arm's planner sees the needs' values
    window_refs = cfg.window_refs and cfg.arm == "ledger"  # ... and the needs' texts
    focus_refs = cfg.focus_refs and cfg.arm == "ledger"
    summary = ""  # memory arm
    history: list[dict] = []  # react arm
    steps: list[dict] = []
    final_events: list[dict] = []

    while not run.ledger.done:
        if run.ledger.steps >= T:
            run.apply(Stop("budget_exhausted", f"{T} steps used"))
            final_events, run.step_events = run.step_events, []
            break
        if cfg.arm != "react" and not ready(run.ledger) and not any_action_can_advance(r0, run.ledger):
            run.apply(Stop("insufficient", "not ready and no action can advance the ledger"))
            final_events, run.step_events = run.step_events, []
            break

        ledger_before = run.ledger
        messages = render.render_planner_messages(
            r0,
            ledger_before,
            latest,
            cfg.arm,
            max_observation_chars=max_obs,
            summary=summary,
            history=history,
            value_refs=value_refs,
            window_refs=window_refs,
            focus_refs=focus_refs,
        )
        sampling = (
            {"temperature": cfg.rejection_temperature, "seed": resample_seed(r0.task_id, ledger_before.steps + 1)}
            if resample and cfg.rejection_temperature > 0
            else {}
        )
        try:
            reply = await roles.planner.decide(messages, tools, r0=r0, ledger=ledger_before, **sampling)
        except ChatError as e:
            if e.kind != "context_length":
                raise  # transport failures end the task (the engine retries it on the next run)
            run.account("planner", e.usage)  # the prompt outgrew the model (react history): a budget, not a fault
            run.apply(Stop("budget_exhausted", "the planner prompt exceeds the model's context"))
            final_events, run.step_events = run.step_events, []
            break
        run.account("planner", reply.usage)
        reply_chars = len(reply.text or "") + bounds.text_size(reply.tool_calls)
        oversized = reply_chars > lim.max_reply_chars
        reply_text = bounds.clean_text(reply.text, lim.max_reply_chars)
        reply_calls = bounds.clean_tool_calls(reply.tool_calls, lim)
        step = {
            "t": ledger_before.steps + 1,
            "latest_observation": latest,  # what render_planner_messages received (re-render: same bytes)
            "planner_input": {"messages": messages, "tools": tools},
            "planner_output": {"text": reply_text, "tool_calls": reply_calls},
            "action": None,
            "raw_observation": "",
            "observation": None,
            "verdict": None,
            "ledger_before": ledger_before.to_dict(),
            "prompt_tokens": reply.usage.prompt_tokens,
            "completion_tokens": reply.usage.completion_tokens,
            "latency_s": reply.usage.latency_s,
        }
        if sampling:
            step["sampling"] = sampling  # a re-sampled call after a rejection (docs/trajectory.md)
        try:
            if oversized:
                raise ActionError("oversized", f"reply of {reply_chars} characters > {lim.max_reply_chars}")
            written = action = parse_action(reply_text, reply_calls, max_depth=lim.max_json_depth)
            action = resolve_refs(
                action,
                ledger_before.filled_values() if value_refs else None,
                ledger_before.named_windows() if window_refs else None,
                ledger_before.query_focuses() if focus_refs else None,
            )
            validate_action(action, tools)
            if cfg.reject_futile_calls and cfg.arm != "react" and action.name != "finish":
                why = futile_reason(action.name, action.arguments, r0, ledger_before)
                if why is not None:
                    raise ActionError("futile_call", why)
        except ActionError as e:
            detail = bounds.clean_text(e.detail, 500)
            run.apply(ModelError(e.kind, detail, role="planner"))
            resample = True
            latest = f"Your previous reply was rejected ({e.kind}): {detail[:300]}. Reply with exactly one tool call."
            if cfg.arm == "react":
                history += [
                    {"role": "assistant", "content": reply_text},
                    {"role": "user", "content": latest},
                ]
            steps.append(_close_step(step, run))
            continue
        step["action"] = written.to_dict()  # as the planner wrote it: what harvest and relabel train on
        if action is not written:
            step["resolved_arguments"] = action.arguments  # what the tool was called with (value references)
        resample = False

        if action.name == "finish":
            draft = str(action.arguments.get("answer", ""))
            latest = await _finish(run, draft)
            steps.append(_close_step(step, run))
            continue

        # ---- tool -> observe -> critic -> reduce ------------------------------------------------------------------
        args_c = canonical_args(action.arguments)
        tgt = action.arguments.get("need_index")
        tgt = tgt if isinstance(tgt, int) and not isinstance(tgt, bool) else infer_target(action.name, run.ledger)
        call_id = f"call_{step['t']}"
        try:
            raw, obs = await toolbox.execute(action.name, action.arguments)
        except Exception as e:  # noqa: BLE001 - any tool-side failure (a ToolFailure or a backend bug) is the
            # tool's error, recorded in the ledger; the run goes on. Program errors in the loop itself still raise.
            if not isinstance(e, ToolFailure):
                e = ToolFailure(f"{type(e).__name__}: {e}")
            err = bounds.clean_text(str(e), 500)
            run.apply(ToolError(action.name, args_c, err, target_need=tgt))
            latest = f"Tool {action.name} failed: {err[:300]}"
            step["raw_observation"] = latest
            if cfg.arm == "react":
                history += [
                    {"role": "assistant", "content": "", "tool_calls": [action.to_tool_call(call_id)]},
                    {"role": "tool", "tool_call_id": call_id, "content": latest},
                ]
            steps.append(_close_step(step, run))
            continue
        finally:  # chat usage of the tool itself (media perception), failed calls included
            for role, tu in (toolbox.take_usage() if hasattr(toolbox, "take_usage") else {}).items():
                run.account(role, tu)
        raw = bounds.clean_text(raw, lim.max_reply_chars)
        obs = bounds.clean_observation(obs, lim)
        raw_shown = render.truncate(raw, max_obs)
        crit_messages = render.render_critic_messages(r0, run.ledger, action.name, action.arguments, raw, obs, max_obs)
        verdict, u = await roles.critic.judge(r0, run.ledger, action.name, action.arguments, obs, crit_messages)
        run.account("critic", u)
        verdict = bounds.clean_verdict(verdict, lim)
        if verdict.gap_type == CRITIC_ERROR_GAP:
            run.apply(ModelError("role_output", verdict.description[:500], role="critic"))
        # the memory arm caps its summary at the digest's length (before or after this commit); no other arm needs it
        digest_len_before_commit = len(render_digest(r0, run.ledger)) if cfg.arm == "memory" else 0
        run.apply(ObservationCommitted(action.name, args_c, obs, verdict, target_need=tgt))
        step.update(raw_observation=raw_shown, observation=plain(obs), verdict=plain(verdict))
        latest = raw
        if cfg.arm == "react":
            history += [
                {"role": "assistant", "content": "", "tool_calls": [action.to_tool_call(call_id)]},
                {"role": "tool", "tool_call_id": call_id, "content": raw_shown},
            ]
        elif cfg.arm == "memory":
            cap = max(digest_len_before_commit, len(render_digest(r0, run.ledger)))
            sm_messages = render.render_summarizer_messages(r0, summary, raw, cap, max_obs)
            summary, u = await roles.summarizer.summarize(r0, summary, raw, cap, sm_messages)
            summary = bounds.clean_text(summary)[:cap]
            run.account("summarizer", u)
            step["summary"] = summary
        steps.append(_close_step(step, run))

    led = run.ledger
    usage = {role: u.to_dict() for role, u in run.usage.items()}
    faults: dict[str, int] = {}
    for u in run.usage.values():
        for k, v in u.faults.items():
            faults[k] = faults.get(k, 0) + v
    return {
        "task_id": r0.task_id,
        "config_hash": config_hash or hash_configs(cfg, roles.models),
        "arm": cfg.arm,
        "models": dict(roles.models),
        "outcome": led.outcome,
        "answer": led.answer,
        "correct": None,
        "question": r0.question,
        "gold_answer": gold,
        "r0": r0.to_dict(),
        "need_parse": {"input": {"messages": np_messages}, "needs": json.loads(needs_json), "output_text": needs_json},
        "initial_events": initial_events,
        "steps": steps,
        "final_events": final_events,
        "final_ledger": led.to_dict(),
        "final_ledger_hash": state_hash(led),
        "usage": usage,
        "faults": faults,
        "model_errors": led.model_errors,
        "tool_errors": led.tool_errors,
    }


async def _finish(run: _Run, draft: str) -> str | None:
    """Handle a finish action; returns the note the planner sees next (None when the run ended)."""
    r0, roles, led = run.r0, run.roles, run.ledger
    lim = run.cfg.limits
    if run.cfg.arm == "react":
        run.apply(AnswerAccepted(draft))
        return None
    if led.blocked_finishes >= r0.budget.max_revisions:
        answer, u = await roles.finalizer.draft(r0, led, render.render_finalizer_messages(r0, led))
        run.account("finalizer", u)
        run.apply(AnswerAccepted(bounds.clean_text(answer, lim.max_value_chars), forced=True))
        return None
    if not ready(led):
        if draft.strip().lower().rstrip(".") == INSUFFICIENT and useful_tools_exhausted(r0, led):
            run.apply(Stop("insufficient", "the planner declared insufficient after every useful tool failed"))
            return None
        reason = _blocked_reason(led)
        run.apply(FinishBlocked(draft, reason))
        return reason
    answer, u = await roles.finalizer.draft(r0, led, render.render_finalizer_messages(r0, led))
    run.account("finalizer", u)
    answer = bounds.clean_text(answer, lim.max_value_chars)
    passed, hint, u = await roles.answer_critic.check(
        r0, led, answer, render.render_answer_critic_messages(r0, led, answer)
    )
    run.account("answer_critic", u)
    hint = bounds.clean_text(hint, lim.max_value_chars) if hint else hint
    if passed:
        run.apply(AnswerAccepted(answer))
        return None
    note = f"answer {answer!r} blocked by the answer check: {hint or 'no hint'}"
    run.apply(FinishBlocked(answer, note))
    return note


def _close_step(step: dict, run: _Run) -> dict:
    step["events"], run.step_events = run.step_events, []
    step["ledger_hash"] = state_hash(run.ledger)
    return step
