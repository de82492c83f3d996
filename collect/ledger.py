"""The typed evidence ledger, its events and the reducer (the ledger's only writer).

Paper mapping (v3 §3.2-3.3, v1 Appendix I):
  R0        -> TaskContext (immutable: question, assets, answer format, options, allowed tools, budget)
  S = {U, F, E, C}
     U      -> Ledger.needs (evidence_needs; U_t = the open ones, U^b_t = the open blocking ones)
     F      -> Ledger.slots (fact / compute slots) + fact_bridges + entity_cards
     E      -> Ledger.atoms (evidence atoms with source tool, asset, time span and need)
     C      -> Ledger.conflicts (+ gap_diagnosis)
  control   -> tool_call_counts, steps, blocked_finishes, failed_calls, errors

Everything here is pure: no clock, no randomness, no I/O. Ids come from the event sequence number.
``reduce(state, event)`` returns a new frozen Ledger; nothing else may construct a changed ledger.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

NEED_STATUSES = ("unfilled", "partial", "filled", "unfillable")
OPEN_STATUSES = ("unfilled", "partial")
TERMINAL_STATUSES = ("filled", "unfillable")
CLOSURE_LEVELS = ("blocking", "supplementary")
NEED_ROLES = ("anchor", "external_fact", "applicability", "compute")
SOURCES = ("visual", "audio", "subtitle", "web", "computation")
VERDICTS = ("SUFFICIENT", "INSUFFICIENT", "CONFLICTING")
OUTCOMES = ("accepted", "repaired", "forced", "insufficient", "budget_exhausted")
INSUFFICIENT = "insufficient"  # the answer of a run that stops without enough evidence (Algorithm 1, line 20)
MODEL_ERROR_KINDS = (
    "unparseable",
    "unknown_tool",
    "bad_arguments",
    "no_action",
    "role_output",
    "too_deep",
    "oversized",
)

# Tools offered per asset type (paper, Appendix I.5) and globally.
PERCEPTION_TOOLS = {
    "video": ("subtitle_grounding", "audio_scout", "clip_grounding", "frame_confirm"),
    "audio": ("subtitle_grounding", "audio_scout"),
    "image": ("frame_confirm",),
}
GLOBAL_TOOLS = ("web_search", "code_executor", "finish")
ALL_TOOLS = ("subtitle_grounding", "audio_scout", "clip_grounding", "frame_confirm") + GLOBAL_TOOLS

# A time window named in a need's text or query_focus ("between 35 s and 50 s", "12s-20s"): the teacher's time_range
# for a perception call on that need, and what collect.summary.window_stats checks a planner's calls against.
TIME_WINDOW_RE = re.compile(r"(\d+(?:\.\d+)?)\s*s\s*(?:and|to|-|–)\s*(\d+(?:\.\d+)?)\s*s\b")


def parse_time_range(text: str) -> tuple[float, float] | None:
    """The first window in `text`, or None. Numbers too long for a float (model-written text: 400 digits read as inf)
    name no window: a window is copied into tool calls and trajectories, which hold finite numbers only."""
    m = TIME_WINDOW_RE.search(text or "")
    if not m:
        return None
    lo, hi = float(m.group(1)), float(m.group(2))
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None


def need_window(query_focus: str | None, need: str | None) -> tuple[float, float] | None:
    """The time window a need names: in its query_focus, else in its text (None: it names none)."""
    return parse_time_range(query_focus or "") or parse_time_range(need or "")


# Which tools serve which preferred_source (used by can_advance and by planners that route by source).
SOURCE_TOOLS = {
    "subtitle": ("subtitle_grounding",),
    "audio": ("audio_scout", "subtitle_grounding"),
    "visual": ("frame_confirm", "clip_grounding"),
    "web": ("web_search",),
    "computation": ("code_executor",),
}


def _check(value: Any, allowed: tuple, what: str) -> None:
    if value not in allowed:
        raise ValueError(f"invalid {what} {value!r}; expected one of {allowed}")


def normalize_value(value: Any) -> str:
    """Canonical form used to decide whether two values agree (format differences are not conflicts)."""
    s = str(value).strip().lower()
    s = re.sub(r"[\s,$%]+", " ", s).strip()
    s = s.rstrip(".")
    try:
        f = float(s.replace(" ", ""))
        return repr(round(f, 6))
    except ValueError:
        return re.sub(r"[^\w.\- ]", "", s)


# --------------------------------------------------------------------------------------------------------------------
# R0: immutable task context
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Asset:
    id: str
    type: Literal["video", "audio", "image"]
    duration: float | None = None
    path: str | None = None

    def __post_init__(self):
        _check(self.type, tuple(PERCEPTION_TOOLS), "asset type")


@dataclass(frozen=True)
class Budget:
    max_steps: int = 15  # T in Algorithm 1
    max_revisions: int = 2  # blocked finishes allowed before the answer is forced
    unfillable_after: int = 3  # failed attempts on one need before it is marked unfillable

    def __post_init__(self):
        if self.max_steps < 1 or self.max_revisions < 0 or self.unfillable_after < 1:
            raise ValueError(f"invalid budget {self}")


@dataclass(frozen=True)
class TaskContext:
    """R0. Never changes during a run."""

    task_id: str
    question: str
    assets: tuple[Asset, ...] = ()
    answer_format: str = "short answer"
    options: tuple[str, ...] = ()
    allowed_tools: tuple[str, ...] = ALL_TOOLS
    budget: Budget = field(default_factory=Budget)

    def tools(self) -> tuple[str, ...]:
        """The action space A(R0): perception tools for the assets present, plus the allowed global tools."""
        offered: list[str] = []
        for a in self.assets:
            for t in PERCEPTION_TOOLS[a.type]:
                if t not in offered:
                    offered.append(t)
        offered += [t for t in GLOBAL_TOOLS if t not in offered]
        return tuple(t for t in ALL_TOOLS if t in offered and (t in self.allowed_tools or t == "finish"))

    def asset(self, asset_id: str | None) -> Asset | None:
        for a in self.assets:
            if a.id == asset_id:
                return a
        return None

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------------------------------
# Ledger records
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeedSpec:
    """A need as declared by the need parser (before it has any runtime state)."""

    need: str
    preferred_source: str = "web"
    closure_level: str = "blocking"
    need_role: str = "external_fact"
    depends_on: tuple[int, ...] = ()
    query_focus: str = ""

    def __post_init__(self):
        _check(self.preferred_source, SOURCES, "preferred_source")
        _check(self.closure_level, CLOSURE_LEVELS, "closure_level")
        _check(self.need_role, NEED_ROLES, "need_role")


@dataclass(frozen=True)
class Need:
    index: int
    need: str
    preferred_source: str
    closure_level: str
    need_role: str
    depends_on: tuple[int, ...]
    query_focus: str
    status: str = "unfilled"
    filled_by: str | None = None
    value: str | None = None
    attempts: int = 0  # failed attempts (no progress) targeted at this need
    note: str = ""

    @property
    def open(self) -> bool:
        return self.status in OPEN_STATUSES

    @property
    def blocking(self) -> bool:
        return self.closure_level == "blocking"


@dataclass(frozen=True)
class Slot:
    """F: one fact or computation slot per blocking need; filled with the need's verified value."""

    name: str
    kind: Literal["fact", "compute"]
    need_index: int
    value: str | None = None
    atom_id: str | None = None


@dataclass(frozen=True)
class Atom:
    """E: a confirmed piece of evidence with its provenance."""

    id: str
    need_index: int | None
    value: str | None
    content: str
    source: str  # tool name
    asset_id: str | None = None
    span: tuple[float, float] | None = None
    step: int = 0


@dataclass(frozen=True)
class Conflict:
    """C: contradicting atoms about one need; both atoms are kept, nothing is overwritten."""

    id: str
    need_index: int
    type: str  # value | temporal | entity | source
    severity: str  # blocking | minor
    description: str
    atom_ids: tuple[str, ...]
    resolved: bool = False
    resolved_by: str | None = None


@dataclass(frozen=True)
class GapDiagnosis:
    gap_type: str  # sufficient | insufficient | conflicting | blocked_finish
    description: str


@dataclass(frozen=True)
class EntityCard:
    name: str
    summary: str
    atom_id: str | None = None


@dataclass(frozen=True)
class FactBridge:
    need_index: int
    query: str
    value: str | None
    source: str
    atom_id: str | None = None


@dataclass(frozen=True)
class Ledger:
    needs: tuple[Need, ...] = ()
    slots: tuple[Slot, ...] = ()
    atoms: tuple[Atom, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    gap_diagnosis: GapDiagnosis | None = None
    entity_cards: tuple[EntityCard, ...] = ()
    fact_bridges: tuple[FactBridge, ...] = ()
    tool_call_counts: tuple[tuple[str, int], ...] = ()
    failed_calls: tuple[str, ...] = ()  # signatures of calls that made no progress (exhausted)
    steps: int = 0
    blocked_finishes: int = 0  # also the number of revisions (each blocked finish asks for one)
    model_errors: int = 0
    tool_errors: int = 0
    seq: int = 0  # number of events reduced so far
    unfillable_after: int = 3
    answer: str | None = None
    outcome: str | None = None
    last_verdict: str | None = None

    # ---- views -----------------------------------------------------------------------------------------------------
    def need(self, i: int) -> Need:
        return self.needs[i]

    def counts(self) -> dict[str, int]:
        return dict(self.tool_call_counts)

    def open_blocking(self) -> list[Need]:
        return [n for n in self.needs if n.blocking and n.status != "filled"]

    def unresolved_conflicts(self) -> list[Conflict]:
        return [c for c in self.conflicts if not c.resolved]

    def filled_values(self) -> dict[int, str]:
        """need index -> value of every filled need with a non-blank value: what a value reference {need:K} may name
        (collect.actions.resolve_text_refs) and what the teacher's queries build on."""
        filled = (n for n in self.needs if n.status == "filled" and n.value is not None)
        return {n.index: str(n.value) for n in filled if str(n.value).strip()}

    def named_windows(self) -> dict[int, tuple[float, float]]:
        """need index -> the time window the need names (need_window): what a window reference {window:K} may name
        (collect.actions.resolve_window_refs)."""
        windows = ((n.index, need_window(n.query_focus, n.need)) for n in self.needs)
        return {i: w for i, w in windows if w is not None}

    def query_focuses(self) -> dict[int, str]:
        """need index -> the need's current query_focus (a critic may have revised it), non-blank ones: what a focus
        reference {focus:K} may name (collect.actions.resolve_text_refs)."""
        return {n.index: str(n.query_focus) for n in self.needs if str(n.query_focus or "").strip()}

    def actionable_indices(self) -> list[int]:
        """Open needs whose dependencies are all terminal (filled or unfillable)."""
        return [n.index for n in self.needs if n.open and self._deps_terminal(n)]

    def blocked_indices(self) -> list[int]:
        return [n.index for n in self.needs if n.open and not self._deps_terminal(n)]

    def _deps_terminal(self, n: Need) -> bool:
        return all(self.needs[d].status in TERMINAL_STATUSES for d in n.depends_on)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def to_dict(self) -> dict:
        # The recorded format keeps "revisions" right after "blocked_finishes" (the same count; the field is gone):
        # ledgers in existing trajectories and rl_states rows, and their state hashes, stay byte-identical.
        # ledger_from_dict ignores the key.
        # A Ledger is frozen, so its snapshot is computed once and shared (treat it as read-only): the loop records
        # `ledger_before` of step t+1 and hashes the state closing step t from the same instance.
        cached = self.__dict__.get("_snapshot")
        if cached is not None:
            return cached
        out = {}
        for k, v in _plain(self).items():
            out[k] = v
            if k == "blocked_finishes":
                out["revisions"] = v
        object.__setattr__(self, "_snapshot", out)
        return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
_FROZEN: dict[type, bool] = {}  # frozen dataclass with an instance __dict__: its dict is cached on the instance


def plain(record) -> Any:
    """A frozen ledger record (event, observation, verdict, need spec) as plain JSON-able dicts and lists: the JSON of
    dataclasses.asdict, without its deep copies (the records are immutable)."""
    return _plain(record)


def _plain(x):
    """Fast equivalent of dataclasses.asdict for the ledger's frozen records (tuples become lists; the JSON is the
    same). asdict deep-copies through a generic path and dominated the per-step bookkeeping cost. Also used for
    events, observations and verdicts (event_to_dict, `plain`): frozen records of scalars and tuples.
    A frozen record's dict is computed once and kept on the instance: a reduce step replaces only the records it
    changes, so the snapshot of the next ledger re-uses the dicts of every need, atom, conflict... it kept (the
    snapshots of one run share them; they are read-only, like the snapshot itself)."""
    t = type(x)
    names = _FIELD_NAMES.get(t)
    if names is None and hasattr(t, "__dataclass_fields__"):
        names = _FIELD_NAMES[t] = tuple(f.name for f in fields(t))
        _FROZEN[t] = t.__dataclass_params__.frozen and hasattr(x, "__dict__")
    if names is not None:
        if not _FROZEN[t]:
            return {n: _plain(getattr(x, n)) for n in names}
        d = x.__dict__.get("_plain")
        if d is None:
            d = {n: _plain(getattr(x, n)) for n in names}
            object.__setattr__(x, "_plain", d)
        return d
    if t is tuple or t is list:
        return [_plain(v) for v in x]
    return x


# --------------------------------------------------------------------------------------------------------------------
# Events: the only way into the ledger
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormalizedObservation:
    """A tool response in the one shape the critic and reducer read (paper: NormalizedToolObservation)."""

    tool: str
    ok: bool
    summary: str  # bounded text the critic reads
    asset_id: str | None = None
    span: tuple[float, float] | None = None
    items: tuple[str, ...] = ()  # individual snippets (subtitle lines, search hits, stdout lines)
    error: str | None = None


@dataclass(frozen=True)
class NeedUpdate:
    """One entry of the critic's updated_need_statuses."""

    need_index: int
    status: str
    value: str | None = None
    filled_by: str | None = None
    evidence: str = ""  # the quoted support for the value
    revised_query_focus: str | None = None
    revised_need_role: str | None = None
    add_depends_on: tuple[int, ...] = ()
    entity: str | None = None  # optional entity card name for anchor needs

    def __post_init__(self):
        _check(self.status, NEED_STATUSES, "need status")
        if self.revised_need_role is not None:
            _check(self.revised_need_role, NEED_ROLES, "need_role")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    gap_type: str = ""
    description: str = ""
    updates: tuple[NeedUpdate, ...] = ()

    def __post_init__(self):
        _check(self.verdict, VERDICTS, "verdict")


@dataclass(frozen=True)
class NeedsDeclared:
    needs: tuple[NeedSpec, ...]
    unfillable_after: int = 3
    kind: str = "needs_declared"


@dataclass(frozen=True)
class ObservationCommitted:
    tool: str
    arguments: str  # canonical JSON of the call arguments
    observation: NormalizedObservation
    verdict: Verdict
    target_need: int | None = None
    kind: str = "observation_committed"


@dataclass(frozen=True)
class FinishBlocked:
    answer: str
    diagnosis: str
    kind: str = "finish_blocked"


@dataclass(frozen=True)
class AnswerAccepted:
    answer: str
    forced: bool = False
    kind: str = "answer_accepted"


@dataclass(frozen=True)
class ModelError:
    error: str  # one of MODEL_ERROR_KINDS
    detail: str
    role: str = "planner"
    kind: str = "model_error"

    def __post_init__(self):
        _check(self.error, MODEL_ERROR_KINDS, "model error kind")


@dataclass(frozen=True)
class ToolError:
    tool: str
    arguments: str
    error: str
    target_need: int | None = None
    kind: str = "tool_error"


@dataclass(frozen=True)
class Stop:
    outcome: str
    reason: str = ""
    answer: str | None = None
    kind: str = "stop"

    def __post_init__(self):
        _check(self.outcome, OUTCOMES, "outcome")


Event = NeedsDeclared | ObservationCommitted | FinishBlocked | AnswerAccepted | ModelError | ToolError | Stop
EVENT_TYPES: dict[str, type] = {
    "needs_declared": NeedsDeclared,
    "observation_committed": ObservationCommitted,
    "finish_blocked": FinishBlocked,
    "answer_accepted": AnswerAccepted,
    "model_error": ModelError,
    "tool_error": ToolError,
    "stop": Stop,
}


def call_signature(tool: str, arguments: str) -> str:
    """Stable id of a tool call (used to mark exhausted calls)."""
    return hashlib.sha1(f"{tool}\x00{arguments}".encode()).hexdigest()[:16]


def canonical_args(arguments: dict | None) -> str:
    return json.dumps(arguments or {}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------------------------------------------------
# The reducer
# --------------------------------------------------------------------------------------------------------------------


def initial_ledger() -> Ledger:
    return Ledger()


def reduce(state: Ledger, event: Event) -> Ledger:
    """S_{t+1} = S_t (+) event. Pure and deterministic; raises on programmer errors (bad event, finished run)."""
    if state.done:
        raise ValueError(f"ledger already finished with outcome {state.outcome!r}; got {event.kind}")
    seq = state.seq + 1
    if isinstance(event, NeedsDeclared):
        new = _declare(state, event)
    elif isinstance(event, ObservationCommitted):
        new = _commit(state, event, seq)
    elif isinstance(event, ToolError):
        new = _tool_error(state, event)
    elif isinstance(event, FinishBlocked):
        new = replace(
            state,
            steps=state.steps + 1,
            blocked_finishes=state.blocked_finishes + 1,
            gap_diagnosis=GapDiagnosis("blocked_finish", event.diagnosis),
        )
    elif isinstance(event, AnswerAccepted):
        outcome = "forced" if event.forced else ("repaired" if state.blocked_finishes else "accepted")
        new = replace(state, steps=state.steps + 1, answer=event.answer, outcome=outcome)
    elif isinstance(event, ModelError):
        new = replace(
            state,
            steps=state.steps + (1 if event.role == "planner" else 0),
            model_errors=state.model_errors + 1,
        )
    elif isinstance(event, Stop):
        new = replace(state, outcome=event.outcome, answer=event.answer if event.answer is not None else state.answer)
    else:
        raise TypeError(f"unknown event {event!r}")
    return replace(new, seq=seq)


def _declare(state: Ledger, ev: NeedsDeclared) -> Ledger:
    if state.needs:
        raise ValueError("needs are declared once per task")
    n = len(ev.needs)
    needs = []
    for i, s in enumerate(ev.needs):
        deps = tuple(sorted({d for d in s.depends_on if isinstance(d, int) and 0 <= d < n and d != i}))
        needs.append(Need(i, s.need, s.preferred_source, s.closure_level, s.need_role, deps, s.query_focus or s.need))
    needs = _break_cycles(needs)
    slots = tuple(
        Slot(f"n{nd.index}", "compute" if nd.need_role == "compute" else "fact", nd.index)
        for nd in needs
        if nd.blocking
    )
    return replace(state, needs=tuple(needs), slots=slots, unfillable_after=max(1, ev.unfillable_after))


def _break_cycles(needs: list[Need]) -> list[Need]:
    """Dependencies may only point to earlier needs (a DAG in declaration order); later ones are dropped."""
    return [replace(nd, depends_on=tuple(d for d in nd.depends_on if d < nd.index)) for nd in needs]


def _bump(counts: tuple[tuple[str, int], ...], tool: str) -> tuple[tuple[str, int], ...]:
    d = dict(counts)
    d[tool] = d.get(tool, 0) + 1
    return tuple(sorted(d.items()))


def _commit(state: Ledger, ev: ObservationCommitted, seq: int) -> Ledger:
    """Apply one critic verdict. Linear in the size of the ledger plus the verdict: a verdict is untrusted model output
    and may carry thousands of updates, so every lookup inside the update loop is a dict access (atoms by id, the open
    conflict of a need, the latest valued atom of a need, cards by entity, bridges by need), never a scan."""
    needs = list(state.needs)
    atoms = list(state.atoms)
    conflicts = list(state.conflicts)
    cards = {c.name: c for c in state.entity_cards}  # insertion order = card order; a replaced card moves to the end
    bridges = {b.need_index: b for b in state.fact_bridges}
    atom_by_id = {a.id: a for a in atoms}
    # (need index, normalized value) -> id of the need's latest atom with that value: a conflict's first side is the
    # atom of the need's current value (not a later atom that kept a stale value without filling the need)
    last_valued: dict[tuple[int | None, str], str] = {}
    for a in atoms:
        if a.value is not None:
            last_valued[(a.need_index, normalize_value(a.value))] = a.id
    open_conflict: dict[int, int] = {}  # need index -> position in `conflicts` of its first unresolved conflict
    for pos, c in enumerate(conflicts):
        if not c.resolved:
            open_conflict.setdefault(c.need_index, pos)
    sides: dict[int, set[str]] = {}  # conflict position -> normalized values of its atoms (filled on first use)
    extra_ids: dict[int, list[str]] = {}  # conflict position -> atom ids appended by this verdict
    progressed: set[int] = set()
    obs = ev.observation

    def keep(up: NeedUpdate, k: int, need: int) -> Atom:
        """E gains the update's value with its provenance."""
        atom = Atom(
            id=f"a{seq}.{k}",
            need_index=need,
            value=str(up.value),
            content=(up.evidence or obs.summary)[:500],
            source=up.filled_by or ev.tool,
            asset_id=obs.asset_id,
            span=obs.span,
            step=state.steps + 1,
        )
        atoms.append(atom)
        atom_by_id[atom.id] = atom
        return atom

    for k, up in enumerate(ev.verdict.updates):
        if not (0 <= up.need_index < len(needs)):
            continue  # critic referenced a need that does not exist: ignored (recorded in the event itself)
        nd = needs[up.need_index]
        if nd.status == "unfillable":
            continue  # terminal
        # control-field revisions are always allowed (they change no evidence)
        if up.revised_query_focus:
            nd = replace(nd, query_focus=up.revised_query_focus)
        if up.revised_need_role:
            nd = replace(nd, need_role=up.revised_need_role)
        if up.add_depends_on:
            extra = {d for d in up.add_depends_on if 0 <= d < nd.index}
            nd = replace(nd, depends_on=tuple(sorted(set(nd.depends_on) | extra)))
        if up.status == "filled" and up.value is not None and str(up.value).strip():
            atom = keep(up, k, nd.index)
            prior_id = last_valued.get((nd.index, normalize_value(nd.value))) if nd.value is not None else None
            last_valued[(nd.index, normalize_value(atom.value))] = atom.id
            pos = open_conflict.get(nd.index)
            if pos is not None:
                # A new source on a contested need: it resolves the conflict when it agrees with exactly one side.
                c = conflicts[pos]
                if pos not in sides:
                    sides[pos] = {normalize_value(atom_by_id[a].value) for a in c.atom_ids}
                value = normalize_value(atom.value)
                if value in sides[pos]:
                    ids = c.atom_ids + tuple(extra_ids.pop(pos, ()))
                    conflicts[pos] = replace(c, atom_ids=ids, resolved=True, resolved_by=atom.id)
                    del open_conflict[nd.index]
                    _next_open_conflict(conflicts, open_conflict, nd.index, pos)
                    nd = replace(nd, status="filled", value=atom.value, filled_by=atom.source)
                    progressed.add(nd.index)
                else:
                    extra_ids.setdefault(pos, []).append(atom.id)
                    sides[pos].add(value)
            elif nd.value is not None and normalize_value(nd.value) != normalize_value(atom.value):
                # Contradiction: keep both atoms, write a conflict, reopen the need as partial. Never overwrite.
                conflicts.append(
                    Conflict(
                        id=f"c{seq}.{k}",
                        need_index=nd.index,
                        type="value",
                        severity="blocking" if nd.blocking else "minor",
                        description=f"need {nd.index}: {nd.value!r} vs {atom.value!r} ({atom.source})",
                        atom_ids=((prior_id,) if prior_id is not None else ()) + (atom.id,),
                    )
                )
                open_conflict[nd.index] = len(conflicts) - 1
                nd = replace(nd, status="partial")
                progressed.add(nd.index)
            elif nd.value is not None:
                progressed.add(nd.index)  # corroboration: same value from another call
                if nd.status != "filled":
                    nd = replace(nd, status="filled")
            else:
                nd = replace(nd, status="filled", value=atom.value, filled_by=atom.source)
                progressed.add(nd.index)
            if nd.status == "filled":
                if up.entity:
                    cards.pop(up.entity, None)
                    cards[up.entity] = EntityCard(up.entity, f"{nd.need}: {nd.value}", atom.id)
                if atom.source == "web_search":
                    bridges.pop(nd.index, None)
                    bridges[nd.index] = FactBridge(nd.index, ev.arguments[:200], nd.value, atom.source, atom.id)
        elif up.status == "partial":
            if up.value is not None and str(up.value).strip():
                # Evidence that does not fill the need (a stale or unconfirmed value): kept in E, the need's value and
                # status stay as they are (an unfilled need becomes partial). It is never a conflict side by itself.
                keep(up, k, nd.index)
            if nd.status == "unfilled":
                nd = replace(nd, status="partial")
                progressed.add(nd.index)
        elif up.status == "unfillable" and nd.status != "filled":
            nd = replace(nd, status="unfillable", note="critic: unfillable")
        needs[nd.index] = nd
    for pos, ids in extra_ids.items():
        conflicts[pos] = replace(conflicts[pos], atom_ids=conflicts[pos].atom_ids + tuple(ids))
    # failed attempt accounting on the targeted need
    failed_calls = state.failed_calls
    tgt = ev.target_need
    if not progressed:
        failed_calls = failed_calls + (call_signature(ev.tool, ev.arguments),)
        if tgt is not None and 0 <= tgt < len(needs) and needs[tgt].open:
            nd = needs[tgt]
            nd = replace(nd, attempts=nd.attempts + 1)
            if nd.attempts >= state.unfillable_after:
                nd = replace(nd, status="unfillable", note=f"{nd.attempts} failed attempts")
            needs[tgt] = nd
    needs = _propagate_unfillable(needs)
    slots = _sync_slots(state.slots, needs, atoms)
    gap = GapDiagnosis(ev.verdict.gap_type or ev.verdict.verdict.lower(), ev.verdict.description)
    return replace(
        state,
        needs=tuple(needs),
        slots=slots,
        atoms=tuple(atoms),
        conflicts=tuple(conflicts),
        entity_cards=tuple(cards.values()),
        fact_bridges=tuple(bridges.values()),
        tool_call_counts=_bump(state.tool_call_counts, ev.tool),
        failed_calls=failed_calls,
        steps=state.steps + 1,
        gap_diagnosis=gap,
        last_verdict=ev.verdict.verdict,
    )


def _next_open_conflict(conflicts: list[Conflict], open_conflict: dict[int, int], need: int, after: int) -> None:
    """The first open conflict of `need` (at `after`) resolved: the next unresolved one (if any) becomes first."""
    for pos in range(after + 1, len(conflicts)):
        c = conflicts[pos]
        if c.need_index == need and not c.resolved:
            open_conflict[need] = pos
            return


def _propagate_unfillable(needs: list[Need]) -> list[Need]:
    """An open need that depends on an unfillable need can never be pursued: it becomes unfillable too."""
    changed = True
    while changed:
        changed = False
        for i, nd in enumerate(needs):
            if nd.open and any(needs[d].status == "unfillable" for d in nd.depends_on):
                needs[i] = replace(nd, status="unfillable", note="upstream need unfillable")
                changed = True
    return needs


def _sync_slots(slots: tuple[Slot, ...], needs: list[Need], atoms: list[Atom]) -> tuple[Slot, ...]:
    """Each slot mirrors its need: the value and the latest atom carrying exactly that value (one pass over atoms)."""
    latest: dict[tuple, str] = {}
    for a in atoms:
        latest[(a.need_index, a.value)] = a.id
    out = []
    for slot in slots:
        nd = needs[slot.need_index]
        if nd.status == "filled" and nd.value is not None:
            out.append(replace(slot, value=nd.value, atom_id=latest.get((nd.index, nd.value))))
        else:
            out.append(replace(slot, value=None, atom_id=None))
    return tuple(out)


def _tool_error(state: Ledger, ev: ToolError) -> Ledger:
    needs = list(state.needs)
    tgt = ev.target_need
    if tgt is not None and 0 <= tgt < len(needs) and needs[tgt].open:
        nd = replace(needs[tgt], attempts=needs[tgt].attempts + 1)
        if nd.attempts >= state.unfillable_after:
            nd = replace(nd, status="unfillable", note=f"{nd.attempts} failed attempts")
        needs[tgt] = nd
    needs = _propagate_unfillable(needs)
    slots = _sync_slots(state.slots, needs, list(state.atoms))
    return replace(
        state,
        needs=tuple(needs),
        slots=slots,
        tool_call_counts=_bump(state.tool_call_counts, ev.tool),
        failed_calls=state.failed_calls + (call_signature(ev.tool, ev.arguments),),
        steps=state.steps + 1,
        tool_errors=state.tool_errors + 1,
    )


def replay(events: list[Event], state: Ledger | None = None) -> Ledger:
    s = state or initial_ledger()
    for e in events:
        s = reduce(s, e)
    return s


# --------------------------------------------------------------------------------------------------------------------
# Readiness and stopping
# --------------------------------------------------------------------------------------------------------------------


def ready(s: Ledger) -> bool:
    """ready(S) = (U^b = {}) and complete(F) and (C unresolved = {})  (v3 §3.3).

    A blocking need that was marked unfillable is terminal but leaves its slot empty, so the ledger is not ready."""
    return (
        bool(s.needs)
        and not s.open_blocking()
        and all(slot.value is not None for slot in s.slots)
        and not s.unresolved_conflicts()
    )


def _tool_serves_asset(tool: str, r0: TaskContext, asset_id: Any) -> bool:
    if tool in GLOBAL_TOOLS:
        return True
    if asset_id is None:
        return any(tool in PERCEPTION_TOOLS[a.type] for a in r0.assets)
    a = r0.asset(str(asset_id))
    return a is not None and tool in PERCEPTION_TOOLS[a.type]


def open_targets(s: Ledger) -> set[int]:
    """Need indices a call may target now: actionable needs and needs with an unresolved conflict."""
    return set(s.actionable_indices()) | {c.need_index for c in s.unresolved_conflicts()}


def can_advance(tool: str, arguments: dict | None, r0: TaskContext, s: Ledger) -> bool:
    """Could this action move the ledger forward? (allowed for R0's assets, within budget, targets an open need /
    empty slot / unresolved conflict, and not a call that already failed)."""
    arguments = arguments or {}
    if tool not in r0.tools() or s.done or s.steps >= r0.budget.max_steps:
        return False
    if tool == "finish":
        return ready(s) or s.blocked_finishes < r0.budget.max_revisions
    if not _tool_serves_asset(tool, r0, arguments.get("asset_id")):
        return False
    if call_signature(tool, canonical_args(arguments)) in s.failed_calls:
        return False
    targets = open_targets(s)
    tgt = arguments.get("need_index")
    if tgt is not None:
        return isinstance(tgt, int) and tgt in targets
    return bool(targets)


def advancing_targets(r0: TaskContext, s: Ledger) -> list[tuple[int, str]]:
    """(need_index, tool) pairs that could still advance the ledger: an actionable need or contested need, and a tool
    offered for R0 that serves the need's preferred source (or any perception/web/compute tool when none does)."""
    if s.done or s.steps >= r0.budget.max_steps:
        return []
    offered = [t for t in r0.tools() if t != "finish"]
    out = []
    targets = list(dict.fromkeys(s.actionable_indices() + [c.need_index for c in s.unresolved_conflicts()]))
    for i in targets:
        nd = s.needs[i]
        if nd.status == "unfillable":
            continue
        preferred = [t for t in SOURCE_TOOLS.get(nd.preferred_source, ()) if t in offered]
        for t in preferred or offered:
            out.append((i, t))
    return out


def infer_target(tool: str, s: Ledger) -> int | None:
    """The need a call most plausibly targets when the planner did not say (no `need_index`): the first contested
    need, else the first actionable need whose preferred source this tool serves, else None. Used so that failed
    attempts are still charged to a need (and needs can become unfillable) with planners that omit need_index."""
    contested = [c.need_index for c in s.unresolved_conflicts()]
    for i in contested + s.actionable_indices():
        if tool in SOURCE_TOOLS.get(s.needs[i].preferred_source, ()):
            return i
    return None


def any_action_can_advance(r0: TaskContext, s: Ledger) -> bool:
    return bool(advancing_targets(r0, s))


def useful_tools_exhausted(r0: TaskContext, s: Ledger) -> bool:
    """The advance check with failed attempts counted: every need that could still be pursued has at least one failed
    attempt, and every tool that serves one of them has been called in this run. A planner that has reached this
    point and declares "insufficient" is right to stop (the loop then ends the run `insufficient`, not `forced`)."""
    pairs = advancing_targets(r0, s)
    called = {t for t, n in s.tool_call_counts if n > 0}
    return all(s.needs[i].attempts > 0 and t in called for i, t in pairs)


# --------------------------------------------------------------------------------------------------------------------
# Hash and digest
# --------------------------------------------------------------------------------------------------------------------


def state_hash(s: Ledger) -> str:
    cached = s.__dict__.get("_state_hash")  # frozen: one hash per instance (asked at each step close and at the end)
    if cached is not None:
        return cached
    blob = json.dumps(s.to_dict(), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=list)
    h = hashlib.sha256(blob.encode()).hexdigest()[:16]
    object.__setattr__(s, "_state_hash", h)
    return h


def _need_view(n: Need) -> dict:
    return {
        "index": n.index,
        "need": n.need,
        "preferred_source": n.preferred_source,
        "closure_level": n.closure_level,
        "status": n.status,
        "filled_by": n.filled_by,
        "need_role": n.need_role,
        "depends_on": list(n.depends_on),
        "query_focus": n.query_focus,
        "value": n.value,
    }


def digest(r0: TaskContext, s: Ledger) -> dict:
    """The bounded control projection every role reads (v1 Appendix I.3, Table 14).

    Its size depends on the declared needs and the evidence (values, unresolved conflicts, one entity card per entity,
    one fact record per need), never on the number of steps taken."""
    return {
        "evidence_needs": [_need_view(n) for n in s.needs],
        "actionable_need_indices": s.actionable_indices(),
        "blocked_need_indices": s.blocked_indices(),
        "tool_call_counts": s.counts(),
        "gap_diagnosis": _plain(s.gap_diagnosis) if s.gap_diagnosis else None,
        "unresolved_conflicts": [
            {"need_index": c.need_index, "type": c.type, "severity": c.severity, "description": c.description}
            for c in s.unresolved_conflicts()
        ],
        "entity_cards": [{"name": c.name, "summary": c.summary} for c in s.entity_cards],
        "fact_bridge_records": [{"need_index": b.need_index, "value": b.value} for b in s.fact_bridges],
        "budget": {
            "steps_used": s.steps,
            "steps_left": max(0, r0.budget.max_steps - s.steps),
            "blocked_finishes": s.blocked_finishes,
        },
        "finish_available": ready(s),
    }


def render_digest(r0: TaskContext, s: Ledger) -> str:
    # compact separators: the C encoder (indent= falls back to the pure-Python one) and fewer prompt tokens
    # Both frozen: the text is kept on the ledger instance for this R0 (the planner's and the critic's prompts of one
    # step render the same ledger).
    cached = s.__dict__.get("_digest")
    if cached is not None and cached[0] is r0:
        return cached[1]
    text = json.dumps(digest(r0, s), ensure_ascii=False, separators=(", ", ": "))
    object.__setattr__(s, "_digest", (r0, text))
    return text


# --------------------------------------------------------------------------------------------------------------------
# (De)serialisation of events for trajectories and replay
# --------------------------------------------------------------------------------------------------------------------


def event_to_dict(e: Event) -> dict:
    return _plain(e)


def _build(cls, d: dict):
    kwargs = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        v = d[f.name]
        if cls is NeedsDeclared and f.name == "needs":
            v = tuple(NeedSpec(**{**x, "depends_on": tuple(x.get("depends_on", ()))}) for x in v)
        elif cls is ObservationCommitted and f.name == "observation":
            v = NormalizedObservation(
                **{**v, "items": tuple(v.get("items", ())), "span": tuple(v["span"]) if v.get("span") else None}
            )
        elif cls is ObservationCommitted and f.name == "verdict":
            ups = tuple(
                NeedUpdate(**{**u, "add_depends_on": tuple(u.get("add_depends_on", ()))}) for u in v.get("updates", ())
            )
            v = Verdict(**{**v, "updates": ups})
        kwargs[f.name] = v
    return cls(**kwargs)


def event_from_dict(d: dict) -> Event:
    kind = d.get("kind")
    if kind not in EVENT_TYPES:
        raise ValueError(f"unknown event kind {kind!r}")
    return _build(EVENT_TYPES[kind], d)


def ledger_from_dict(d: dict) -> Ledger:
    """Inverse of Ledger.to_dict() (used by rewards to evaluate the finish gate on a recorded snapshot)."""

    def tup(x):
        return tuple(x) if x is not None else None

    return Ledger(
        needs=tuple(Need(**{**n, "depends_on": tuple(n["depends_on"])}) for n in d.get("needs", ())),
        slots=tuple(Slot(**s) for s in d.get("slots", ())),
        atoms=tuple(Atom(**{**a, "span": tup(a.get("span"))}) for a in d.get("atoms", ())),
        conflicts=tuple(Conflict(**{**c, "atom_ids": tuple(c["atom_ids"])}) for c in d.get("conflicts", ())),
        gap_diagnosis=GapDiagnosis(**d["gap_diagnosis"]) if d.get("gap_diagnosis") else None,
        entity_cards=tuple(EntityCard(**c) for c in d.get("entity_cards", ())),
        fact_bridges=tuple(FactBridge(**b) for b in d.get("fact_bridges", ())),
        tool_call_counts=tuple((k, v) for k, v in d.get("tool_call_counts", ())),
        failed_calls=tuple(d.get("failed_calls", ())),
        **{
            k: d[k]
            for k in (
                "steps",
                "blocked_finishes",
                "model_errors",
                "tool_errors",
                "seq",
                "unfillable_after",
                "answer",
                "outcome",
                "last_verdict",
            )
            if k in d
        },
    )
