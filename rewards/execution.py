"""The execution check (``compute``): a candidate program is run and its output compared with the reference's.

Not one of the paper's four dimensions (its default weight is 0, so the paper's reward is unchanged); a recipe turns
it on with ``reward_weights: {..., compute: W}``. Why it exists: the judged ``align`` of a ``code_executor`` call with
the reference's tool and need but another program is 0.6 + 0.3 x the word overlap of the two programs, and a program
is mostly the same helper library whatever it computes, so a wrong formula scores ~0.9 against the reference's 1.0
and GRPO's groups cannot tell a program that computes the wrong thing (docs/training.md "Why the round and GRPO do not
beat SFT") from the right one. Running both says which is which.

    compute = None   the state's reference decision is not a code_executor call (the check does not apply), or the
                     reference program itself does not run to completion here, or the sandbox could not run (a skip,
                     like a failed judge call: left out of the group baseline, never a punishment)
              0      the candidate is not a valid code_executor call, or its program fails, or prints another value
              1      its program runs and prints the reference program's value (collect.ledger.normalize_value of the
                     whole stdout: "586", "586.0" and "586\\n" agree)

Candidate and reference are resolved as the runtime resolves them (value and window references, rewards.rules
.check_candidate and rewards.judge.JudgeState), then run in the runtime's sandbox (collect.tools.code_executor
.run_code_async) under the code tool's default limits; each distinct program runs once per process (a memo, shared by
concurrent calls). Nothing here trusts model text: the program never runs in the trainer's process.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any

from collect.ledger import normalize_value
from collect.tools.code_executor import run_code_async
from rewards.judge import _states
from rewards.rules import check_candidate

log = logging.getLogger(__name__)

CODE_TOOL = "code_executor"


@dataclass
class ExecutionCheck:
    """Runs programs in the sandbox and remembers what each printed (normalized) or that it failed (None)."""

    timeout_s: float = 10.0  # collect.config.ToolsConfig's code_timeout_s / code_memory_mb defaults
    memory_mb: int = 512
    max_concurrency: int = 4
    outputs: dict[str, str | None] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=lambda: {"runs": 0, "cache_hits": 0, "sandbox_errors": 0})

    def __post_init__(self):
        self._inflight: dict[str, asyncio.Future] = {}
        # one per event loop (TRL's reward loop, each asyncio.run of rl.score), keyed by the loop itself: an id() could
        # be reused by a later loop and hand it a semaphore bound to a closed one
        self._sem: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def output(self, code: str) -> str | None:
        """The program's normalized stdout when it ran to completion (exit 0, no kill), else None. A sandbox that
        could not run it raises (the caller skips the candidate)."""
        if code in self.outputs:
            self.stats["cache_hits"] += 1
            return self.outputs[code]
        loop = asyncio.get_running_loop()
        fut = self._inflight.get(code)
        if fut is not None and fut.get_loop() is loop:
            self.stats["cache_hits"] += 1
            return await fut
        fut = loop.create_future()
        self._inflight[code] = fut
        try:
            sem = self._sem.setdefault(loop, asyncio.Semaphore(self.max_concurrency))
            async with sem:
                self.stats["runs"] += 1
                res = await run_code_async(code, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            out = normalize_value(res.stdout) if res.ok else None
            self.outputs[code] = out
            fut.set_result(out)
            return out
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: a failure nobody else awaits is not reported as "never retrieved"
            raise
        finally:
            if self._inflight.get(code) is fut:
                del self._inflight[code]

    async def score(self, reference: dict, action, error: str | None) -> float | None:
        """compute for one candidate (the module docstring's table)."""
        ref_code = (reference.get("arguments") or {}).get("code") if reference.get("name") == CODE_TOOL else None
        if not isinstance(ref_code, str) or not ref_code.strip():
            return None
        try:
            want = await self.output(ref_code)
            if want is None:
                return None  # the reference does not run here: nothing to check against
            if action is None or error is not None or action.name != CODE_TOOL:
                return 0.0
            got = await self.output(action.arguments["code"])
        except Exception as e:  # noqa: BLE001 - a sandbox that cannot run is a skip, never a crash of training
            self.stats["sandbox_errors"] += 1
            log.warning("compute reward skipped: the sandbox failed: %s: %s", type(e).__name__, e)
            return None
        return 1.0 if got is not None and got == want else 0.0


_ACTIVE: list[ExecutionCheck] = [ExecutionCheck()]


def use_execution_check(check: ExecutionCheck) -> ExecutionCheck:
    """Make ``check`` the one ``compute`` uses (process-wide, as the judge: TRL passes dataset columns only)."""
    _ACTIVE[0] = check
    return check


def get_execution_check() -> ExecutionCheck:
    return _ACTIVE[0]


async def compute(completions: list, **kwargs: Any) -> list[float | None]:
    """r_compute in {0, 1, None}: on a state whose reference decision is a program, does the candidate's program print
    what the reference's prints (None elsewhere: the check does not apply). Columns as the judge reads them
    (reference_action, ledger, tools, question, gold_answer; prompts for value/window references)."""
    check = get_execution_check()
    states = _states(len(completions), kwargs)
    scored = []
    for state, completion in zip(states, completions, strict=True):
        if state.reference.get("name") != CODE_TOOL:
            scored.append(None)
            continue
        action, error = check_candidate(completion, state.tools, state.ledger, state.refs)
        scored.append(check.score(state.reference, action, error))
    results = await asyncio.gather(*(s for s in scored if s is not None))
    it = iter(results)
    out = [None if s is None else next(it) for s in scored]
    log_metric = kwargs.get("log_metric")
    if log_metric is not None:
        log_metric("compute/applies", float(sum(s is not None for s in scored)))
    return out
