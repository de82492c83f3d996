"""The runtime loop (v3 Algorithm 1) for the arms `ledger` (the method), `memory` and `react`; returns a trajectory.

Algorithm 1 -> `run_task` (ledger arm; `start_run`, then `step` until the ledger is done):
  S_0 <- needs(R0)                      start_run -> _declare_needs: need_parser.parse -> NeedsDeclared -> reduce
  for t = 1..T:                         `while` (every planner call is one step, errors included); T spent -> Stop
    if not ready(S) and no a with can_advance(a, R0, S): return insufficient
                                        stop_before_decide (`any_action_can_advance`) -> Stop(insufficient)
    d_t <- digest(R0, S_t); a_t <- decide(d_t; A(R0))
                                        _decide: the arm's prompt -> planner.decide -> parse_action + references
                                        resolved + validate_action; a model error -> ModelError, next step
    if a_t = finish:                    arm.finish (_gate_and_finalize for ledger / memory):
      if not ready(S_t): S <- S (+) blocked-finish diagnosis          FinishBlocked (gate; no finalizer call)
      else y <- finalize(S_t); if answer_critic(y) = PASS: return y  AnswerAccepted (accepted | repaired)
           else S <- S (+) blocked-finish diagnosis                   FinishBlocked(hint)
    else o_t <- execute(a_t); v_t <- critic(d_t, o_t); S <- S (+) event(o_t, v_t)
                                        _observe: execute -> critic.judge -> ObservationCommitted; a tool exception
                                        -> ToolError
  return budget_exhausted               Stop(budget_exhausted)
Departures from the textbook, all explicit:
  * Forced answer: a finish attempted once blocked_finishes >= max_revisions skips gate and answer critic; the
    finalizer drafts from the ledger and AnswerAccepted(forced=True) ends the run (outcome `forced`).
  * The latest raw observation (or the error/blocked-finish note) is shown to the planner once, truncated; the
    digest is the planner's only memory in the ledger arm.
  * insufficient / budget_exhausted end with answer None here; the collect engine (collect/run.py) then reports the
    answer "insufficient" for both, as Algorithm 1 does (lines 17 and 20), and keeps the outcome labels apart.
  * References (RuntimeConfig.references, ledger arm): the planner may write "{need:K}", "{window:K}", "{focus:K}"
    for what the ledger holds; they are resolved (collect.actions.resolve_refs) before validation, the tool and the
    critic; the step keeps the action as written and adds `resolved_arguments`.
Arms over the same tools and budget (each an `Arm`: what the planner sees, what it keeps, how a finish ends):
  memory: the planner sees R0 + a rolling summary (summarizer after each observation, capped at the length of the
          rendered digest at that step) + the latest observation; critic, gate and stopping as in `ledger`.
  react:  the planner sees R0 + its own assistant tool_call / tool messages (raw observations accumulate); finish
          returns the planner's answer at once (no gate, no finalizer, no answer critic, no insufficient stop). The
          need parser and critic still run so the ledger is recorded for audit, but the planner never sees them.
Model errors (unparseable reply, unknown tool, bad arguments, unreadable critic output) and tool failures become
events and the loop goes on; anything else (transport errors after retries, bugs) raises.
A run between two steps can be copied (`Run.fork`) and each copy stepped on its own: the online trainer
(rl/online.py) executes several sampled decisions from one state that way.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

from collect import bounds
from collect.actions import Action, ActionError, parse_action, resolve_refs, validate_action
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


async def run_task(
    task_or_r0, roles: Roles, toolbox, runtime_cfg: RuntimeConfig, *, config_hash: str | None = None
) -> dict:
    """Run one task to its outcome and return its trajectory record (see docs/trajectory.md).

    config_hash: the record's `config_hash`, written here only; the collect engine passes its whole recipe's hash
    (CollectConfig.hash(), the one in OUT/run_config.json). Default: a hash of the runtime config and role models."""
    r0, gold = _task_parts(task_or_r0)
    run = await start_run(r0, roles, toolbox, runtime_cfg)  # S_0 <- needs(R0)
    while not run.ledger.done:
        await step(run, toolbox)  # one t of Algorithm 1's loop: a stop, or decide -> finish | execute + critic
    return record(run, gold, config_hash)


async def start_run(r0: TaskContext, roles: Roles, toolbox, cfg: RuntimeConfig) -> Run:
    """A run at S_0: the budget from the runtime config, the needs declared, A(R0) rendered as tool schemas."""
    r0 = replace(r0, budget=cfg.budget())  # the runtime config is the one source of the budget
    run = Run(r0, roles, cfg, ARMS[cfg.arm](r0, roles, cfg))
    run.need_parse = await _declare_needs(run)
    run.tools = render.tools_for(r0, toolbox.schemas())
    return run


def stop_before_decide(run: Run) -> tuple[str, str] | None:
    """(outcome, reason) when the run ends before its next planner call (T spent; not ready and nothing can advance
    the ledger), else None: the next `step` asks the planner."""
    if run.ledger.steps >= run.cfg.max_steps:
        return "budget_exhausted", f"{run.cfg.max_steps} steps used"
    if run.arm.stops_insufficient and not ready(run.ledger) and not any_action_can_advance(run.r0, run.ledger):
        return "insufficient", "not ready and no action can advance the ledger"
    return None


async def step(run: Run, toolbox) -> None:
    """One iteration of Algorithm 1's loop on an unfinished run: the stop checks, else one planner call on the arm's
    view of the state and what follows from its reply (gate / finalizer for a finish, tool + critic + reducer for a
    call, a model error for a rejected reply)."""
    if (stop := stop_before_decide(run)) is not None:
        run.stop(*stop)
        return
    decided = await _decide(run, run.tools, run.latest)  # d_t <- digest(R0, S_t); a_t <- decide(d_t; A(R0))
    if decided is None:  # the prompt outgrew the model's context: a budget, not a fault
        run.stop("budget_exhausted", "the planner prompt exceeds the model's context")
        return
    step_rec, action, run.latest = decided
    if action is not None and action.name == "finish":
        run.latest = await run.arm.finish(run, str(action.arguments.get("answer", "")))
    elif action is not None:
        run.latest = await _observe(run, step_rec, action, toolbox)  # o_t; v_t <- critic(d_t, o_t); S (+) event
    run.close_step(step_rec)


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


class Run:
    """Mutable bookkeeping of one task run: the ledger, the recorded steps and events, usage per role, the arm's
    memory and the note the planner sees at its next call (`latest`, shown once)."""

    def __init__(self, r0: TaskContext, roles: Roles, cfg: RuntimeConfig, arm: Arm):
        self.r0, self.roles, self.cfg, self.arm = r0, roles, cfg, arm
        self.ledger = initial_ledger()
        self.usage: dict[str, Usage] = {}
        self.step_events: list[dict] = []
        self.initial_events: list[dict] = []
        self.steps: list[dict] = []
        self.final_events: list[dict] = []
        self.latest: str | None = None  # shown once to the planner at the next step
        self.tools: list[dict] = []  # A(R0) as the planner's tool schemas (start_run)
        self.need_parse: dict = {}  # the record's `need_parse` (start_run)

    def apply(self, event) -> None:
        self.ledger = reduce(self.ledger, event)
        self.step_events.append(event_to_dict(event))

    def account(self, role: str, u: Usage) -> None:
        self.usage.setdefault(role, Usage(model=u.model)).add(u)

    def stop(self, outcome: str, reason: str) -> None:
        """End the run outside any step (budget spent, nothing can advance): the Stop is a final event."""
        self.apply(Stop(outcome, reason))
        self.final_events, self.step_events = self.step_events, []

    def close_step(self, step: dict) -> None:
        step["events"], self.step_events = self.step_events, []
        step["ledger_hash"] = state_hash(self.ledger)
        self.steps.append(step)

    def fork(self, roles: Roles | None = None) -> Run:
        """An independent copy of this run between two steps (the online trainer, rl/online.py, executes several
        decisions from one state): the ledger is frozen and closed step records are never changed, so they are
        shared; the lists, the usage and the arm's memory are copied. `roles`: the fork's roles (default: these)."""
        if self.step_events:
            raise RuntimeError("Run.fork: a run can only be forked between steps")
        new = copy.copy(self)
        new.roles = roles if roles is not None else self.roles
        new.usage = copy.deepcopy(self.usage)
        new.initial_events, new.steps, new.final_events = list(self.initial_events), list(self.steps), []
        new.step_events = []
        new.arm = self.arm.fork()
        return new


async def _declare_needs(run: Run) -> dict:
    """S_0: the need parser's needs declared in the ledger; returns the record's `need_parse`."""
    r0 = run.r0
    messages = render.render_need_parser_messages(r0)
    needs, u = await run.roles.need_parser.parse(r0, messages)
    run.account("need_parser", u)
    needs = bounds.clean_needs(needs, run.cfg.limits)  # every role output is bounded and made UTF-8-safe (bounds.py)
    run.apply(NeedsDeclared(tuple(needs), unfillable_after=run.cfg.unfillable_after))
    run.initial_events, run.step_events = run.step_events, []
    needs_json = json.dumps([plain(n) for n in needs], ensure_ascii=False)
    return {"input": {"messages": messages}, "needs": json.loads(needs_json), "output_text": needs_json}


async def _decide(run: Run, tools: list[dict], latest: str | None) -> tuple[dict, Action | None, str | None] | None:
    """One planner call on the arm's view of the state: (the step record so far, the valid action or None when the
    reply was rejected, the note the planner sees next on a rejection). None when the prompt exceeds the context."""
    r0, lim, ledger = run.r0, run.cfg.limits, run.ledger
    messages = run.arm.messages(ledger, latest)
    try:
        reply = await run.roles.planner.decide(messages, tools, r0=r0, ledger=ledger)
    except ChatError as e:
        if e.kind != "context_length":
            raise  # transport failures end the task (the engine retries it on the next run)
        run.account("planner", e.usage)
        return None
    run.account("planner", reply.usage)
    reply_chars = len(reply.text or "") + bounds.text_size(reply.tool_calls)
    reply_text = bounds.clean_text(reply.text, lim.max_reply_chars)
    reply_calls = bounds.clean_tool_calls(reply.tool_calls, lim)
    step = {
        "t": ledger.steps + 1,
        "latest_observation": latest,  # what the arm's prompt received (re-render: same bytes)
        "planner_input": {"messages": messages, "tools": tools},
        "planner_output": {"text": reply_text, "tool_calls": reply_calls},
        "action": None,
        "raw_observation": "",
        "observation": None,
        "verdict": None,
        "ledger_before": ledger.to_dict(),
        "prompt_tokens": reply.usage.prompt_tokens,
        "completion_tokens": reply.usage.completion_tokens,
        "latency_s": reply.usage.latency_s,
    }
    try:
        if reply_chars > lim.max_reply_chars:
            raise ActionError("oversized", f"reply of {reply_chars} characters > {lim.max_reply_chars}")
        written = parse_action(reply_text, reply_calls, max_depth=lim.max_json_depth)
        action = resolve_refs(written, ledger, run.arm.refs)
        validate_action(action, tools)
    except ActionError as e:
        detail = bounds.clean_text(e.detail, 500)
        run.apply(ModelError(e.kind, detail, role="planner"))
        note = f"Your previous reply was rejected ({e.kind}): {detail[:300]}. Reply with exactly one tool call."
        run.arm.rejected(reply_text, note)
        return step, None, note
    step["action"] = written.to_dict()  # as the planner wrote it: what harvest and relabel train on
    if action is not written:
        step["resolved_arguments"] = action.arguments  # what the tool was called with (references resolved)
    return step, action, None


async def _observe(run: Run, step: dict, action: Action, toolbox) -> str:
    """o_t <- execute(a_t); v_t <- critic(d_t, o_t); S <- S (+) event(o_t, v_t); returns the next latest note."""
    r0, lim, max_obs = run.r0, run.cfg.limits, run.cfg.max_observation_chars
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
        note = f"Tool {action.name} failed: {err[:300]}"
        step["raw_observation"] = note
        run.arm.observed(action, call_id, note)
        return note
    finally:  # chat usage of the tool itself (media perception), failed calls included
        for role, tu in (toolbox.take_usage() if hasattr(toolbox, "take_usage") else {}).items():
            run.account(role, tu)
    raw = bounds.clean_text(raw, lim.max_reply_chars)
    obs = bounds.clean_observation(obs, lim)
    raw_shown = render.truncate(raw, max_obs)
    messages = render.render_critic_messages(r0, run.ledger, action.name, action.arguments, raw, obs, max_obs)
    verdict, u = await run.roles.critic.judge(r0, run.ledger, action.name, action.arguments, obs, messages)
    run.account("critic", u)
    verdict = bounds.clean_verdict(verdict, lim)
    if verdict.gap_type == CRITIC_ERROR_GAP:
        run.apply(ModelError("role_output", verdict.description[:500], role="critic"))
    before = run.ledger
    run.apply(ObservationCommitted(action.name, args_c, obs, verdict, target_need=tgt))
    step.update(raw_observation=raw_shown, observation=plain(obs), verdict=plain(verdict))
    run.arm.observed(action, call_id, raw_shown)
    await run.arm.remember(run, step, raw, before)
    return raw


def record(run: Run, gold: str | None = None, config_hash: str | None = None) -> dict:
    """The trajectory record of a finished run (docs/trajectory.md)."""
    led, r0 = run.ledger, run.r0
    faults: dict[str, int] = {}
    for u in run.usage.values():
        for k, v in u.faults.items():
            faults[k] = faults.get(k, 0) + v
    return {
        "task_id": r0.task_id,
        "config_hash": config_hash or hash_configs(run.cfg, run.roles.models),
        "arm": run.cfg.arm,
        "models": dict(run.roles.models),
        "outcome": led.outcome,
        "answer": led.answer,
        "correct": None,
        "question": r0.question,
        "gold_answer": gold,
        "r0": r0.to_dict(),
        "need_parse": run.need_parse,
        "initial_events": run.initial_events,
        "steps": run.steps,
        "final_events": run.final_events,
        "final_ledger": led.to_dict(),
        "final_ledger_hash": state_hash(led),
        "usage": {role: u.to_dict() for role, u in run.usage.items()},
        "faults": faults,
        "model_errors": led.model_errors,
        "tool_errors": led.tool_errors,
    }


# ---- the arms ---------------------------------------------------------------------------------------------------


class Arm:
    """The ledger arm (the method): the planner reads R0 + the digest + the latest observation, with the references
    the runtime offers; a finish goes through the gate, the finalizer and the answer critic."""

    stops_insufficient = True  # Algorithm 1's insufficient stop before each planner call

    def __init__(self, r0: TaskContext, roles: Roles, cfg: RuntimeConfig):
        self.r0, self.cfg = r0, cfg
        self.refs = cfg.references

    def messages(self, ledger: Ledger, latest: str | None) -> list[dict]:
        return render.render_planner_messages(
            self.r0, ledger, latest, "ledger", max_observation_chars=self.cfg.max_observation_chars, refs=self.refs
        )

    def fork(self) -> Arm:
        """A copy for a forked run (Run.fork); an arm with memory copies it."""
        return copy.copy(self)

    def rejected(self, reply_text: str, note: str) -> None:
        """A rejected reply; `note` is what the planner sees next."""

    def observed(self, action: Action, call_id: str, shown: str) -> None:
        """A tool call's observation (or its failure note) as the planner is shown it."""

    async def remember(self, run: Run, step: dict, raw: str, before: Ledger) -> None:
        """After a committed observation (`before`: the ledger it was committed to)."""

    async def finish(self, run: Run, draft: str) -> str | None:
        return await _gate_and_finalize(run, draft)


class MemoryArm(Arm):
    """R0 + a rolling summary (capped at the digest's length, before or after this commit) + the latest observation;
    no references (the planner sees no needs)."""

    def __init__(self, r0: TaskContext, roles: Roles, cfg: RuntimeConfig):
        super().__init__(r0, roles, cfg)
        if roles.summarizer is None:
            raise ValueError(f"task {r0.task_id}: arm 'memory' needs roles.summarizer")
        self.refs, self.summary = (), ""

    def messages(self, ledger: Ledger, latest: str | None) -> list[dict]:
        return render.render_planner_messages(
            self.r0,
            ledger,
            latest,
            "memory",
            max_observation_chars=self.cfg.max_observation_chars,
            summary=self.summary,
        )

    async def remember(self, run: Run, step: dict, raw: str, before: Ledger) -> None:
        r0, max_obs = self.r0, self.cfg.max_observation_chars
        cap = max(len(render_digest(r0, before)), len(render_digest(r0, run.ledger)))
        messages = render.render_summarizer_messages(r0, self.summary, raw, cap, max_obs)
        summary, u = await run.roles.summarizer.summarize(r0, self.summary, raw, cap, messages)
        self.summary = bounds.clean_text(summary)[:cap]
        run.account("summarizer", u)
        step["summary"] = self.summary


class ReactArm(Arm):
    """R0 + the planner's own tool calls and their (truncated) observations, accumulating; finish answers at once."""

    stops_insufficient = False

    def __init__(self, r0: TaskContext, roles: Roles, cfg: RuntimeConfig):
        super().__init__(r0, roles, cfg)
        self.refs, self.history = (), []

    def fork(self) -> ReactArm:
        new = copy.copy(self)
        new.history = list(self.history)
        return new

    def messages(self, ledger: Ledger, latest: str | None) -> list[dict]:
        return render.render_planner_messages(
            self.r0,
            ledger,
            latest,
            "react",
            max_observation_chars=self.cfg.max_observation_chars,
            history=self.history,
        )

    def rejected(self, reply_text: str, note: str) -> None:
        self.history += [{"role": "assistant", "content": reply_text}, {"role": "user", "content": note}]

    def observed(self, action: Action, call_id: str, shown: str) -> None:
        self.history += [
            {"role": "assistant", "content": "", "tool_calls": [action.to_tool_call(call_id)]},
            {"role": "tool", "tool_call_id": call_id, "content": shown},
        ]

    async def finish(self, run: Run, draft: str) -> str | None:
        run.apply(AnswerAccepted(draft))
        return None


ARMS: dict[str, type[Arm]] = {"ledger": Arm, "memory": MemoryArm, "react": ReactArm}


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


async def _over_context(run: Run, role: str, call):
    """`await call()` for a role whose prompt grows with the evidence (finalizer, answer critic). A prompt over the
    model's context ends the run as the planner's does (budget_exhausted, the engine answers "insufficient"), not
    the task with an error on every rerun; returns None then."""
    try:
        return await call()
    except ChatError as e:
        if e.kind != "context_length":
            raise
        run.account(role, e.usage)
        run.apply(Stop("budget_exhausted", f"the {role} prompt exceeds the model's context"))
        return None


async def _gate_and_finalize(run: Run, draft: str) -> str | None:
    """A finish in the ledger and memory arms; returns the note the planner sees next (None when the run ended)."""
    r0, roles, led = run.r0, run.roles, run.ledger
    lim = run.cfg.limits
    finalize = lambda: roles.finalizer.draft(r0, led, render.render_finalizer_messages(r0, led))  # noqa: E731
    if led.blocked_finishes >= r0.budget.max_revisions:
        if (drafted := await _over_context(run, "finalizer", finalize)) is None:
            return None
        answer, u = drafted
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
    if (drafted := await _over_context(run, "finalizer", finalize)) is None:
        return None
    answer, u = drafted
    run.account("finalizer", u)
    answer = bounds.clean_text(answer, lim.max_value_chars)
    messages = render.render_answer_critic_messages(r0, led, answer)
    checked = await _over_context(run, "answer_critic", lambda: roles.answer_critic.check(r0, led, answer, messages))
    if checked is None:
        return None
    passed, hint, u = checked
    run.account("answer_critic", u)
    hint = bounds.clean_text(hint, lim.max_value_chars) if hint else hint
    if passed:
        run.apply(AnswerAccepted(answer))
        return None
    note = f"answer {answer!r} blocked by the answer check: {hint or 'no hint'}"
    run.apply(FinishBlocked(answer, note))
    return note
