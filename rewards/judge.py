"""The two judged reward dimensions (paper v3 Appendix F.3): action targeting and policy alignment.

Both scores come from ONE judge call per (state, candidate): the ``target`` and ``align`` reward functions share it
through the judge's memo (finished results in an in-memory cache, optionally mirrored to a JSONL file; calls in
flight are awaited, not repeated). A judge failure is a skip, not a punishment: the candidate gets ``None`` for both
dimensions (TRL turns None into NaN and leaves it out of the group baseline), is counted in ``Judge.stats`` and is
logged through TRL's ``log_metric`` when given. This is the difference from a single-judge reward that maps a judge
error to a zero reward.

Two judges share the interface:
  OfflineJudge  deterministic, reads the ledger snapshot (actionable needs, preferred sources, need_index, query
                overlap with the query focus and upstream values, equality with the reference action). Used for the
                embedded world, CPU demos and tests.
  OpenAIJudge   an async OpenAI-compatible chat call (collect.llm.ChatClient: the collect runtime's fault classes,
                retries, deadline, usage/cost and redaction) with the rubric in rewards/prompts/judge.md, a cache
                and bounded concurrency. The API key is read from the env var named in the recipe, never stored.

The active judge is process-wide (``use_judge``) because TRL calls reward functions with dataset columns only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collect import jsonio
from collect.actions import (
    Action,
    ActionError,
    offered_refs,
    resolve_refs,
)
from collect.config import EndpointConfig
from collect.ledger import (
    SOURCE_TOOLS,
    Ledger,
    call_signature,
    canonical_args,
    normalize_value,
    ready,
)
from collect.llm import ChatClient, ChatError, Usage
from rewards.rules import check_candidate, completion_text, ledger_of, load_json_column

log = logging.getLogger(__name__)

PROMPT_PATH = Path(__file__).parent / "prompts" / "judge.md"
STATE_COLUMNS = ("question", "gold_answer", "ledger", "reference_action", "tools")


@dataclass(frozen=True)
class JudgeScore:
    target: float
    align: float


@dataclass
class JudgeConfig:
    """Reward-judge settings (the ``judge:`` block of an RL recipe)."""

    kind: str = field(default="offline", metadata={"help": "offline (deterministic, ledger rules) | openai"})
    base_url: str = field(default="", metadata={"help": "OpenAI-compatible endpoint, e.g. http://host:8000/v1"})
    model: str = field(default="", metadata={"help": "judge model name at the endpoint"})
    api_key_env: str = field(
        default="OPENAI_API_KEY", metadata={"help": "env var holding the API key ('' = endpoint needs no key)"}
    )
    prompt_path: str = field(default=str(PROMPT_PATH), metadata={"help": "rubric prompt file"})
    max_retries: int = field(default=2, metadata={"help": "extra attempts after a failed/garbled call"})
    retry_backoff_s: float = field(default=1.0, metadata={"help": "first retry delay; doubles per attempt"})
    timeout_s: float = field(default=60.0, metadata={"help": "per-request timeout"})
    max_concurrency: int = field(default=16, metadata={"help": "judge requests in flight at once"})
    temperature: float = field(default=0.0, metadata={"help": "judge sampling temperature"})
    max_tokens: int = field(default=256, metadata={"help": "judge reply budget"})
    cache_path: str | None = field(default=None, metadata={"help": "optional JSONL cache shared across runs"})


@dataclass(frozen=True)
class JudgeState:
    """What the judge sees about one rl_states row."""

    question: str
    gold_answer: str
    ledger: Ledger
    ledger_json: str
    digest: str
    reference: dict
    tools: list
    key: str
    refs: tuple[str, ...] = ()  # the reference kinds the state's prompt offers: candidate and reference are resolved

    @classmethod
    def from_columns(cls, row: dict) -> JudgeState:
        missing = [c for c in STATE_COLUMNS if c not in row]
        if missing:
            raise KeyError(f"rl_states row lacks column(s) {missing}; the judge needs {list(STATE_COLUMNS)}")
        ledger_json = row["ledger"] if isinstance(row["ledger"], str) else json.dumps(row["ledger"], sort_keys=True)
        ledger = ledger_of(ledger_json)
        ref = load_json_column(row["reference_action"], "reference_action") or {}
        tools = load_json_column(row["tools"], "tools")
        refs = tuple(row.get("refs") or ())
        if refs and ref.get("name"):  # the teacher's, resolved as the runtime did
            ref = _resolved(ref, ledger, refs)
        fields = [row["question"], row["gold_answer"], ledger_json, ref, tools, list(refs)]
        blob = json.dumps(fields, sort_keys=True, ensure_ascii=False)
        digest = row.get("digest") or ""
        return cls(
            question=str(row["question"]),
            gold_answer=str(row["gold_answer"]),
            ledger=ledger,
            ledger_json=ledger_json,
            digest=digest if isinstance(digest, str) else json.dumps(digest),
            reference=ref,
            tools=tools,
            key=hashlib.sha256(blob.encode()).hexdigest()[:24],
            refs=refs,
        )


def _resolved(ref: dict, ledger: Ledger, refs: tuple[str, ...]) -> dict:
    """The reference action with its references resolved (kept as recorded if one names nothing)."""
    try:
        return resolve_refs(Action(ref["name"], ref.get("arguments") or {}), ledger, refs).to_dict()
    except ActionError:
        return ref


def pair_key(state: JudgeState, text: str, judge: str = "") -> str:
    """Cache key of one (state, completion) pair under one judge and its scoring settings (Judge.cache_tag)."""
    return hashlib.sha256(f"{judge}\x00{state.key}\x00{text}".encode()).hexdigest()[:32]


# --------------------------------------------------------------------------------------------------------------------
# Judge base: memo, cache, stats
# --------------------------------------------------------------------------------------------------------------------


class Judge:
    """Scores candidates once per (state, completion) and remembers the result; subclasses implement ``_judge``."""

    name = "judge"

    @property
    def cache_tag(self) -> str:
        """What a cached score depends on besides the pair: the judge and its scoring settings (a cache file shared
        by two judges, or by one judge before and after a setting changed, must not hand one the other's scores)."""
        return self.name

    def __init__(self, cache_path: str | os.PathLike | None = None):
        self.cache: dict[str, JudgeScore] = {}
        self._inflight: dict[str, asyncio.Future] = {}
        self.stats = {"requests": 0, "cache_hits": 0, "failures": 0, "scored": 0}
        self.cache_path = Path(cache_path) if cache_path else None
        if self.cache_path and self.cache_path.exists():
            for n, line in enumerate(self.cache_path.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    self.cache[d["key"]] = JudgeScore(float(d["target"]), float(d["align"]))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    log.warning("judge cache %s line %d unreadable (%s); ignored", self.cache_path, n, e)

    async def _judge(self, state: JudgeState, completion: Any, text: str) -> JudgeScore | None:
        raise NotImplementedError

    async def score(self, state: JudgeState, completion: Any) -> JudgeScore | None:
        """One score per (state, completion); repeated pairs hit the cache, concurrent ones share the call."""
        text = completion_text(completion)
        key = pair_key(state, text, self.cache_tag)
        if key in self.cache:
            self.stats["cache_hits"] += 1
            return self.cache[key]
        loop = asyncio.get_running_loop()
        fut = self._inflight.get(key)
        if fut is not None and fut.get_loop() is loop:
            self.stats["cache_hits"] += 1
            return await fut
        fut = loop.create_future()
        self._inflight[key] = fut
        try:
            self.stats["requests"] += 1
            try:
                result = await self._judge(state, completion, text)
            except Exception as e:  # a judge must never crash training: a failure is a skip
                log.warning("%s failed on state %s: %s: %s", self.name, state.key, type(e).__name__, e)
                result = None
            if result is None:
                self.stats["failures"] += 1
            else:
                self.stats["scored"] += 1
                self._remember(key, result)
            fut.set_result(result)
            return result
        finally:
            if self._inflight.get(key) is fut:
                del self._inflight[key]

    def _remember(self, key: str, s: JudgeScore) -> None:
        self.cache[key] = s
        if self.cache_path:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self.cache_path.open("a") as f:
                f.write(jsonio.dumps({"key": key, "target": s.target, "align": s.align}) + "\n")

    async def score_batch(self, completions: list, columns: dict) -> list[JudgeScore | None]:
        """Scores for a TRL batch; ``columns`` are the reward kwargs (dataset columns as aligned lists)."""
        states = _states(len(completions), columns)
        return list(await asyncio.gather(*(self.score(s, c) for s, c in zip(states, completions, strict=True))))


def _states(n: int, columns: dict) -> list[JudgeState]:
    """Build (and reuse, since G candidates share a state) the JudgeState of each row of a batch."""
    out, seen = [], {}
    for i in range(n):
        row = {c: columns[c][i] for c in (*STATE_COLUMNS, "digest") if c in columns}
        if "prompts" in columns:  # GRPO's rendered prompts: which references do they offer?
            row["refs"] = offered_refs(columns["prompts"][i])
        k = json.dumps(row, sort_keys=True, default=str)
        if k not in seen:
            seen[k] = JudgeState.from_columns(row)
        out.append(seen[k])
    return out


# --------------------------------------------------------------------------------------------------------------------
# Offline (deterministic) judge
# --------------------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")
_STOP = {"the", "and", "for", "with", "what", "which", "who", "how", "that", "this", "from", "was", "are", "is", "of"}


def _tokens(text: str) -> set[str]:
    return {w for w in _WORD.findall(str(text).lower()) if len(w) > 1 and w not in _STOP}


def answers_match(answer: Any, gold: Any) -> bool:
    """Same answer up to format (collect.ledger.normalize_value), or the gold answer appears as whole words."""
    a, g = normalize_value(answer), normalize_value(gold)
    if not g:
        return False
    return a == g or re.search(rf"(?<![\w.]){re.escape(g)}(?![\w])", a) is not None


def _query_overlap(args: dict, focus_tokens: set[str]) -> float:
    """Share of the need's focus words that the call's free-text arguments mention (0.5 when it has none)."""
    texts = [v for k, v in args.items() if isinstance(v, str) and k not in ("asset_id",)]
    if not texts or not focus_tokens:
        return 0.5
    cand = set().union(*(_tokens(t) for t in texts))
    return min(1.0, len(cand & focus_tokens) / max(1, min(len(focus_tokens), 6)))


def offline_scores(state: JudgeState, action: Action | None, error: str | None) -> JudgeScore:
    """Deterministic target/align from the ledger snapshot. Invalid actions score 0 on both."""
    if action is None or error is not None:
        return JudgeScore(0.0, 0.0)
    L = state.ledger
    ref = state.reference or {}
    is_ready = ready(L)
    if action.name == "finish":
        if not is_ready:
            return JudgeScore(0.0, 0.0)  # premature convergence: the failure closure-aligned RL targets
        match = answers_match(action.arguments.get("answer", ""), state.gold_answer)
        return JudgeScore(1.0, 1.0 if match else 0.25)

    targets = [i for i in L.actionable_indices() if L.needs[i].status != "unfillable"]
    targets += [c.need_index for c in L.unresolved_conflicts() if c.need_index not in targets]
    ni = action.arguments.get("need_index")
    if not targets or call_signature(action.name, canonical_args(action.arguments)) in L.failed_calls:
        target = 0.0  # nothing left to advance, or a call that already failed on this ledger
        overlap = 0.0
    else:

        def fit(i: int) -> tuple[float, float]:
            nd = L.needs[i]
            focus = _tokens(nd.query_focus or nd.need)
            for d in nd.depends_on:  # an upstream value (e.g. a name found earlier) belongs in a good query
                if L.needs[d].value:
                    focus |= _tokens(L.needs[d].value)
            source_ok = 1.0 if action.name in SOURCE_TOOLS.get(nd.preferred_source, ()) else 0.0
            return source_ok, _query_overlap(action.arguments, focus)

        if isinstance(ni, int) and not isinstance(ni, bool) and ni in targets:
            source_ok, overlap = fit(ni)
            addressed = 1.0
        elif ni is None:  # no declared target: credit the best-fitting actionable need, at half weight
            source_ok, overlap = max(fit(i) for i in targets)
            addressed = 0.5
        else:  # targets a filled, blocked or nonexistent need
            source_ok, overlap, addressed = 0.0, 0.0, 0.0
        target = round(0.4 * addressed + 0.3 * source_ok + 0.3 * overlap, 4) if addressed else 0.0

    same = ref.get("name") == action.name and canonical_args(ref.get("arguments")) == canonical_args(action.arguments)
    if same:
        align = 1.0
    elif ref.get("name") == "finish":
        align = 0.0  # the reference closed the run here; another tool call is not an equally good decision
    elif ref.get("name") == action.name and (ref.get("arguments") or {}).get("need_index") == ni:
        ref_tokens = set().union(
            *(_tokens(v) for k, v in (ref.get("arguments") or {}).items() if isinstance(v, str)), set()
        )
        # the reference's tool on its need with another query or window: worth its query overlap
        align = round(0.6 + 0.3 * _query_overlap(action.arguments, ref_tokens), 4)
    else:
        align = round(0.6 * target, 4)  # an alternative path is worth what its targeting is worth
    return JudgeScore(float(target), float(align))


class OfflineJudge(Judge):
    """Deterministic judge over the ledger snapshot (embedded world, demos, tests)."""

    name = "offline_judge"

    async def _judge(self, state: JudgeState, completion: Any, text: str) -> JudgeScore | None:
        action, error = check_candidate(completion, state.tools, state.ledger, state.refs)
        return offline_scores(state, action, error)


# --------------------------------------------------------------------------------------------------------------------
# OpenAI-compatible LLM judge
# --------------------------------------------------------------------------------------------------------------------

_JSON_OBJ = re.compile(r"\{.*\}", re.DOTALL)


def parse_judge_reply(text: str | None) -> JudgeScore:
    """The {"target", "align"} object of a judge reply; raises ValueError on anything else."""
    m = _JSON_OBJ.search(text or "")
    if not m:
        raise ValueError(f"judge reply has no JSON object: {(text or '')[:120]!r}")
    d = json.loads(m.group(0))
    out = []
    for k in ("target", "align"):
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"judge reply field {k!r} = {v!r}; expected a number in [0, 1]")
        out.append(float(v))
    return JudgeScore(*out)


class OpenAIJudge(Judge):
    """One chat call per candidate to an OpenAI-compatible endpoint, rubric from a prompt file.

    Transport faults are handled by `collect.llm.ChatClient` (429/5xx/timeouts/connection/malformed bodies retried up
    to ``max_retries`` with backoff from ``retry_backoff_s``; other 4xx not retried); a reply that does not parse as
    the rubric's JSON is asked again, up to ``max_retries`` more times. ``usage`` sums every call (tokens, cost,
    retries, faults)."""

    name = "openai_judge"

    def __init__(self, cfg: JudgeConfig):
        super().__init__(cfg.cache_path)
        if not cfg.base_url or not cfg.model:
            raise ValueError(
                f"judge.kind=openai needs judge.base_url and judge.model (got {cfg.base_url!r}, {cfg.model!r})"
            )
        if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
            raise ValueError(f"judge.api_key_env={cfg.api_key_env!r} is not set in the environment")
        self.cfg = cfg
        self.endpoint = EndpointConfig(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env or None,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            temperature=cfg.temperature,
            max_tokens=cfg.max_tokens,
            backoff_base_s=cfg.retry_backoff_s,
        )
        self.usage = Usage(model=cfg.model)
        self.template = Path(cfg.prompt_path).read_text()
        self._per_loop: dict[int, tuple[Any, asyncio.AbstractEventLoop]] = {}

    @property
    def cache_tag(self) -> str:
        rubric = hashlib.sha256(self.template.encode()).hexdigest()[:12]
        return f"{self.name}:{self.cfg.model}:{self.cfg.temperature}:{rubric}"

    def _client(self):
        """A ChatClient per event loop (TRL runs async rewards on its own loop; scripts use asyncio.run); its semaphore
        bounds the judge's requests in flight."""

        loop = asyncio.get_running_loop()
        got = self._per_loop.get(id(loop))
        if got is None or got[1] is not loop:
            got = (ChatClient(self.endpoint, asyncio.Semaphore(self.cfg.max_concurrency)), loop)
            self._per_loop[id(loop)] = got
        return got[0]

    def render(self, state: JudgeState, completion: Any, text: str) -> str:
        action, error = check_candidate(completion, state.tools, state.ledger, state.refs)
        parsed = (json.dumps(action.to_dict(), ensure_ascii=False) if action is not None else "(does not parse)") + (
            f"  [invalid: {error}]" if error else ""
        )
        fields = {
            "question": state.question,
            "gold_answer": state.gold_answer,
            "ready": "yes" if ready(state.ledger) else "no",
            "digest": state.digest or state.ledger_json,
            "reference": json.dumps(state.reference, ensure_ascii=False),
            "candidate": text[:4000],
            "parsed": parsed,
        }
        out = self.template
        for k, v in fields.items():
            out = out.replace("{{" + k + "}}", v)
        return out

    async def _judge(self, state: JudgeState, completion: Any, text: str) -> JudgeScore | None:
        client = self._client()
        messages = [{"role": "user", "content": self.render(state, completion, text)}]
        last: Exception | None = None
        for _ in range(self.cfg.max_retries + 1):
            try:
                resp = await client.chat(messages)
            except ChatError as e:  # retried by the client as far as its policy allows: give up (a skip)
                self.usage.add(e.usage)
                last = e
                break
            self.usage.add(resp.usage)
            try:
                return parse_judge_reply(resp.text)
            except ValueError as e:  # an unparseable or out-of-range reply: ask again
                self.usage.fault("malformed")
                last = e
        log.warning("judge gave up on state %s: %s: %s", state.key, type(last).__name__, last)
        return None


# --------------------------------------------------------------------------------------------------------------------
# The active judge and the two TRL reward functions
# --------------------------------------------------------------------------------------------------------------------

_ACTIVE: list[Judge] = [OfflineJudge()]


def build_judge(cfg: JudgeConfig | dict | None) -> Judge:
    """Judge from a recipe's ``judge:`` block."""
    if cfg is None:
        cfg = JudgeConfig()
    if isinstance(cfg, dict):
        unknown = set(cfg) - set(JudgeConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown judge config key(s) {sorted(unknown)}")
        cfg = JudgeConfig(**cfg)
    if cfg.kind == "offline":
        return OfflineJudge(cfg.cache_path)
    if cfg.kind == "openai":
        return OpenAIJudge(cfg)
    raise ValueError(f"judge.kind={cfg.kind!r}; expected 'offline' or 'openai'")


def use_judge(judge: Judge) -> Judge:
    """Make ``judge`` the one ``target``/``align`` call; returns it."""
    _ACTIVE[0] = judge
    return judge


def get_judge() -> Judge:
    return _ACTIVE[0]


async def target(completions: list, **kwargs) -> list[float | None]:
    """r_target in [0, 1]: does the action address an open need and could its observation advance it (None = judge
    failed, skipped). Logs judge/skipped and judge/cache_hits via TRL's log_metric when provided."""
    judge = get_judge()
    before = dict(judge.stats)
    scores = await judge.score_batch(completions, kwargs)
    log_metric = kwargs.get("log_metric")
    if log_metric is not None:
        log_metric("judge/skipped", float(sum(s is None for s in scores)))
        log_metric("judge/requests", float(judge.stats["requests"] - before["requests"]))
    return [s.target if s is not None else None for s in scores]


async def align(completions: list, **kwargs) -> list[float | None]:
    """r_align in [0, 1]: agreement with the reference decision or an equally reasonable alternative; a finish earns
    full credit only when the ledger is ready and the draft matches the gold answer (None = judge failed, skipped).
    Shares the judge call with ``target`` through the judge's memo."""
    scores = await get_judge().score_batch(completions, kwargs)
    return [s.align if s is not None else None for s in scores]
