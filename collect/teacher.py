"""Offline, deterministic teacher roles for the embedded world.

Honesty contract (what each role may read):
- need parser: the task's GOLD CHAIN (privileged) -> NeedSpec list, gold values stripped.
- planner: ONLY R0 (r0) and the typed ledger. It never sees the gold chain, the gold answer or task.meta. It takes the
  first contested or actionable need, picks a tool by the need's preferred source (collect.ledger.SOURCE_TOOLS),
  builds arguments from the need's query_focus and the values of its filled upstream needs, switches to alternatives
  when a call already failed (ledger.failed_calls) and finishes when collect.ledger.ready(ledger).
  For compute needs it writes a self-contained Python program from the formula in query_focus and upstream values.
- evidence critic: the GOLD CHAIN and task.meta["alt_values"] (privileged). It fills a need when the observation
  contains the need's gold value, and reports a need as filled with a different value when the observation asserts a
  known wrong value (outdated listing / conflicting source), so that the reducer records a conflict.
- finalizer and answer critic: only the ledger (final need's value; the option letter for multiple choice).
In evaluation only the planner is swapped for a model; critic and finalizer stay fixed (paper, training setup).
"""

from __future__ import annotations

import json
import re

from collect.actions import (
    Action,
    focus_formula,
    offered_refs,
    write_refs,
)
from collect.compute import program
from collect.ledger import (
    INSUFFICIENT,
    PERCEPTION_TOOLS,
    SOURCE_TOOLS,
    Ledger,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    TaskContext,
    Verdict,
    call_signature,
    can_advance,
    canonical_args,
    need_window,
    normalize_value,
    ready,
)
from collect.roles.base import PlannerReply, Roles, Usage
from collect.tasks import Task
from collect.values import ValueMatch, exact_in_text, find_value, same_value, value_in_text, value_matches

TEACHER_MODEL = "offline-teacher"
PERCEPTION_ORDER = ("subtitle_grounding", "frame_confirm", "audio_scout", "clip_grounding")


def _usage() -> Usage:
    return Usage(model=TEACHER_MODEL, calls=1)


def _evidence_line(value: str, obs: NormalizedObservation) -> str:
    """The observation's line that asserts the value (an exact reading first, then the normalized one)."""
    lines = obs.items or obs.summary.splitlines()
    for line in lines:
        if exact_in_text(value, line):
            return line[:400]
    for line in lines:
        if value_matches(value, line):
            return line[:400]
    return obs.summary[:400]


def final_value(r0: TaskContext, ledger: Ledger) -> str:
    """The answer the ledger supports: the last blocking need's value (mapped to an option letter for MC)."""
    if not ready(ledger):
        return INSUFFICIENT
    blocking = [n for n in ledger.needs if n.blocking and n.value is not None]
    if not blocking:
        return INSUFFICIENT
    value = blocking[-1].value or ""
    if r0.options:
        return option_letter(value, r0.options) or value
    return value


def option_letter(value: str, options: tuple[str, ...] | list[str]) -> str | None:
    """The letter of the option the value is: the same text, else the same day or quantity written another way
    (collect.values.same_value: "2016-09-17" is "B. 17 September 2016"), else the option that contains it."""
    nv = normalize_value(value)
    parsed = []
    for i, opt in enumerate(options):
        m = re.match(r"\s*([A-Z])[.)]\s*(.*)", opt)
        letter, text = (m.group(1), m.group(2)) if m else ("ABCDEFGH"[i], opt)
        parsed.append((letter, text, normalize_value(text)))
    for letter, _, nt in parsed:
        if nt == nv:
            return letter
    for letter, text, _ in parsed:
        if same_value(value, text):
            return letter
    for letter, _, nt in parsed:
        if nv and (nv in nt or nt in nv):
            return letter
    return None


# --------------------------------------------------------------------------------------------------------------------
# Need parser (privileged: gold chain)
# --------------------------------------------------------------------------------------------------------------------


class TeacherNeedParser:
    def __init__(self, task: Task):
        self._chain = task.gold_chain

    async def parse(self, r0: TaskContext, messages: list[dict]) -> tuple[list[NeedSpec], Usage]:
        specs = [
            NeedSpec(
                need=g.need,
                preferred_source=g.preferred_source,
                closure_level=g.closure_level,
                need_role=g.need_role,
                depends_on=tuple(g.depends_on),
                query_focus=g.query_focus,
            )
            for g in self._chain
        ]
        return specs, _usage()


# --------------------------------------------------------------------------------------------------------------------
# Planner (honest: R0 + ledger only)
# --------------------------------------------------------------------------------------------------------------------


def _widen(query: str, *more: str) -> str:
    """The query followed by the content words of `more` it lacks (order kept, each word once)."""
    words = query.split()
    have = {w.lower() for w in words}
    for text in more:
        for w in re.findall(r"[A-Za-z0-9']+", text):
            lw = w.lower()
            if lw not in have and lw not in _STOP and len(lw) > 2:
                words.append(w)
                have.add(lw)
    return " ".join(words)


_STOP = frozenset(
    "the and for with from that this what which who whom whose when where how many much does did was were are "
    "its their his her into onto about video audio image clip".split()
)


class TeacherPlanner:
    """Reads r0 and the ledger only (see module docstring)."""

    async def decide(
        self,
        messages: list[dict],
        tools: list[dict],
        *,
        r0: TaskContext,
        ledger: Ledger,
    ) -> PlannerReply:
        offered = [t.get("function", t)["name"] for t in tools] if tools else list(r0.tools())
        action = self.choose(r0, ledger, offered, offered_refs(messages))
        return PlannerReply(text=action.to_text(), tool_calls=[], usage=_usage())

    def choose(self, r0: TaskContext, ledger: Ledger, offered: list[str], refs: tuple[str, ...] = ()) -> Action:
        """The teacher's next call, with what the ledger holds written as the references of the kinds `refs` the
        prompt offers (RuntimeConfig.references; collect.actions.write_refs)."""
        return write_refs(self._choose(r0, ledger, offered), ledger, refs)

    def _choose(self, r0: TaskContext, ledger: Ledger, offered: list[str]) -> Action:
        if ready(ledger):
            return Action("finish", {"answer": final_value(r0, ledger)})
        contested = list(dict.fromkeys(c.need_index for c in ledger.unresolved_conflicts()))
        targets = contested + [i for i in ledger.actionable_indices() if i not in contested]
        for i in targets:
            for tool, args in self.candidates(r0, ledger, i, offered, contested=i in contested):
                if tool not in offered:
                    continue
                if call_signature(tool, canonical_args(args)) in ledger.failed_calls:
                    continue
                if can_advance(tool, args, r0, ledger):
                    return Action(tool, args)
        return Action("finish", {"answer": INSUFFICIENT})

    # ---- candidate calls, in order of preference ----------------------------------------------------------------
    def candidates(self, r0: TaskContext, ledger: Ledger, i: int, offered: list[str], contested: bool) -> list:
        nd = ledger.needs[i]
        upstream = " ".join(
            ledger.needs[d].value
            for d in nd.depends_on
            if ledger.needs[d].status == "filled" and ledger.needs[d].value
        )
        focus = nd.query_focus or nd.need
        query = f"{upstream} {focus}".strip()
        if contested:
            # A third source settles a conflict. Its sides came from web pages (a self-contradicting web): consult the
            # media first, on the assets that already gave this task evidence, then an official record, then the
            # other assets. Its sides came from the media: an official record first, then the other media.
            used = {a.source for a in ledger.atoms if a.need_index == i}
            media = [
                (t, args) for t, args in self._perception_calls(r0, nd, query, PERCEPTION_ORDER, None) if t not in used
            ]
            web = [("web_search", {"query": f"{query} official record", "need_index": i})]
            if used - {"web_search"}:
                return web + media
            seen = {a.asset_id for a in ledger.atoms if a.asset_id is not None}
            if seen:
                return (
                    [c for c in media if c[1]["asset_id"] in seen]
                    + web
                    + [c for c in media if c[1]["asset_id"] not in seen]
                )
            return media + web
        if nd.preferred_source == "computation":
            code = self._program(ledger, nd)
            return [
                ("code_executor", {"code": code, "need_index": i}),
                ("code_executor", {"code": "# second attempt\n" + code, "need_index": i}),
            ]
        if nd.preferred_source == "web":
            return [
                ("web_search", {"query": query, "need_index": i}),
                ("web_search", {"query": f"{upstream} {nd.need}".strip(), "need_index": i}),
                ("web_search", {"query": f'"{upstream}" {focus} official record'.strip(), "need_index": i}),
            ]
        preferred = [t for t in SOURCE_TOOLS.get(nd.preferred_source, ()) if t in offered]
        rest = [t for t in PERCEPTION_ORDER if t not in preferred]
        tr = need_window(focus, nd.need)
        first = self._perception_calls(r0, nd, query, preferred, tr)
        others = self._perception_calls(r0, nd, query, rest, tr)
        if tr is not None:
            return first + others
        # No time window: when the preferred tools find nothing for the focus (the annotation search needs a shared
        # word), widen before switching tools: a scan of the whole asset (a time range returns the best-overlapping
        # entries even when none shares a word) ranked by the query plus the need's and the question's other words.
        wide = _widen(query, nd.need, r0.question)
        scans = []
        for t, args in self._perception_calls(r0, nd, wide, preferred, None):
            asset = r0.asset(args["asset_id"])
            if asset is not None and asset.type != "image":
                span = [0.0, float(asset.duration or 86400.0)]
                scans.append((t, {"asset_id": asset.id, "query": wide, "time_range": span, "need_index": nd.index}))
            elif wide != query:  # an image has no time axis: only the wider query
                scans.append((t, args))
        return first + scans + others

    @staticmethod
    def _perception_calls(r0, nd, query: str, tools, tr) -> list:
        hinted = [a for a in r0.assets if re.search(rf"\b{re.escape(a.id)}\b", f"{nd.need} {nd.query_focus}")]
        assets = hinted + [a for a in r0.assets if a not in hinted]
        out = []
        for tool in tools:
            for a in assets:
                if tool not in PERCEPTION_TOOLS[a.type]:
                    continue
                args: dict = {"asset_id": a.id, "query": query}
                if tr is not None and a.type != "image":
                    args["time_range"] = [tr[0], tr[1]]
                args["need_index"] = nd.index
                out.append((tool, args))
        return out

    @staticmethod
    def _program(ledger: Ledger, nd) -> str:
        expr = focus_formula(nd.query_focus)
        values = {d: ledger.needs[d].value or "" for d in nd.depends_on}
        if expr is None:  # no formula given: print the upstream values so the critic can read them
            return "\n".join(f"print({v!r})" for v in values.values()) + "\n"
        return program(expr, values)


# --------------------------------------------------------------------------------------------------------------------
# Evidence critic (privileged: gold chain + known wrong values)
# --------------------------------------------------------------------------------------------------------------------


class TeacherCritic:
    """Privileged evidence critic (module docstring). The task's declared wrong values (`meta.alt_values`) are
    handled by kind, in an order that does not depend on how they were declared (docs/world.md, "Outdated, conflicting
    and unresolved evidence"):

    - the gold value is in the observation: it fills the need; a `conflicting` value seen with it (in this observation
      or kept from an earlier one) is reported first, so the reducer records the conflict and a third source must
      settle it; an `outdated` value seen with it is ignored (the current value is here);
    - no gold value: two or more `conflicting` values (seen now or kept) are all reported (a conflict); one
      `conflicting` or any `outdated` value is kept as evidence that does not fill the need (a `partial` update with
      the value: the ledger keeps the atom, the need stays open, the gap diagnosis says why);
    - a filled need: a `conflicting` value without the gold reopens it as a conflict; an `outdated` one is kept as
      stale evidence, the need stays filled;
    - a contested need is settled only by a source that asserts the gold value; a declared wrong value never settles
      it, and a need marked `unresolved_conflict` (no gold) is never settled.
    """

    def __init__(self, task: Task):
        self._chain = task.gold_chain
        self._alts = {int(k): v for k, v in (task.meta.get("alt_values") or {}).items()}

    def _third_source(self, gold: str, i: int, ledger: Ledger, obs: NormalizedObservation) -> str | None:
        """The first result line that asserts the gold value and none of the known wrong values, and that is not the
        evidence of an atom the need already has (a new, independent source); None when there is none."""
        known = {a.content for a in ledger.atoms if a.need_index == i}
        alts = [a["value"] for a in self._alts.get(i, [])]
        for line in obs.items:
            line = line[:400]
            if line in known or not value_in_text(gold, line) or any(value_in_text(v, line) for v in alts):
                continue
            return line
        return None

    def _seen_alts(self, i: int, text: str) -> list[tuple[str, str, ValueMatch]]:
        """The declared wrong values of need i that the text asserts, as (value, kind, match), in a canonical order
        (by normalized value), never the order of declaration."""
        seen = {}
        for a in self._alts.get(i, []):
            value = a["value"]
            m = find_value(value, text)
            if m is not None and value not in seen:
                seen[value] = (value, a.get("kind", "outdated"), m)
        return sorted(seen.values(), key=lambda x: (normalize_value(x[0]), x[0]))

    async def judge(
        self,
        r0: TaskContext,
        ledger: Ledger,
        tool: str,
        arguments: dict,
        observation: NormalizedObservation,
        messages: list[dict],
    ) -> tuple[Verdict, Usage]:
        if not observation.ok:
            return Verdict("INSUFFICIENT", "insufficient", f"{tool} failed: {observation.error or 'error'}"), _usage()
        text = observation.summary + "\n" + "\n".join(observation.items)
        contested = {c.need_index for c in ledger.unresolved_conflicts()}
        tgt = arguments.get("need_index")
        if isinstance(tgt, int) and 0 <= tgt < len(ledger.needs):
            cands = [tgt]
        else:
            cands = list(dict.fromkeys(sorted(contested) + ledger.actionable_indices()))
        updates: list[NeedUpdate] = []
        notes: list[str] = []  # values kept unused (stale / unconfirmed), contested values repeated
        read: dict[int, dict[str, ValueMatch]] = {}  # need -> value -> where the observation asserts it
        conflict = False
        for i in cands:
            if i >= len(self._chain):
                continue
            nd = ledger.needs[i]
            if nd.status == "unfillable":
                continue
            gold = self._chain[i].gold_value
            gold_m = find_value(gold, text) if gold is not None else None
            gold_in = gold_m is not None
            seen = self._seen_alts(i, text)
            read[i] = {v: m for v, _, m in seen} | ({gold: gold_m} if gold_m is not None else {})
            conflicting = [v for v, k, _ in seen if k == "conflicting"]
            outdated = [v for v, k, _ in seen if k != "conflicting"]
            anchor = nd.need_role == "anchor"

            def up(v: str, status: str = "filled", note: str = "", i=i, anchor=anchor) -> NeedUpdate:
                return NeedUpdate(
                    i,
                    status,
                    value=v,
                    filled_by=tool,
                    evidence=note + _evidence_line(v, observation),
                    entity=v if anchor and status == "filled" else None,
                )

            def kept(vs: list[str], kind: str, i=i) -> list[NeedUpdate]:
                # evidence that does not fill the need: the ledger keeps it as an atom of a partial update
                old = {(a.value, a.content) for a in ledger.atoms if a.need_index == i}
                out = [u for v in vs if ((u := up(v, "partial", f"[{kind}, not used] ")).value, u.evidence) not in old]
                for v in vs:
                    notes.append(f"need {i}: {v!r} is a value the task declares {kind}; kept as evidence, not used")
                return out

            if nd.status == "filled" and i not in contested:
                # a filled need is re-reported only when this observation contradicts it (-> reducer conflict)
                if gold_in:
                    continue
                against = [v for v in conflicting if normalize_value(v) != normalize_value(nd.value or "")]
                if against:
                    updates.append(up(against[0]))
                    conflict = True
                elif outdated:
                    updates += kept(outdated, "outdated")
                continue
            if i in contested:
                if gold_in and not seen:
                    updates.append(up(gold))
                elif gold_in:
                    # both values appear (e.g. a search returns the contested pages again): a result that asserts
                    # the gold value alone and is not already evidence of this need is the third source
                    third = self._third_source(gold, i, ledger, observation)
                    if third is not None:
                        updates.append(
                            NeedUpdate(
                                i,
                                "filled",
                                value=gold,
                                filled_by=tool,
                                evidence=third,
                                entity=gold if anchor else None,
                            )
                        )
                elif seen:  # a declared wrong value never settles a conflict
                    notes.append(f"need {i}: the observation repeats a contested value; it settles nothing")
                continue
            # open need: the conflicting values kept from earlier observations count with the ones seen now
            declared = {a["value"] for a in self._alts.get(i, []) if a.get("kind") == "conflicting"}
            earlier = {a.value: a for a in ledger.atoms if a.need_index == i and a.value in declared}
            sides = sorted({*conflicting, *earlier}, key=lambda v: (normalize_value(v), v))
            # a side seen now is reported from this observation, a kept one again from the atom that kept it
            reported = [
                up(v)
                if v in conflicting
                else NeedUpdate(i, "filled", value=v, filled_by=earlier[v].source, evidence=earlier[v].content)
                for v in sides
            ]
            if gold_in and sides:
                updates += reported + [up(gold)]
                conflict = True
            elif gold_in:
                updates.append(up(gold))
            elif len(sides) >= 2:
                updates += reported
                conflict = True
            else:
                updates += kept(conflicting, "conflicting") + kept(outdated, "outdated")
        for u in updates:  # how each value used was read, when it is not written as the task declares it
            m = read.get(u.need_index, {}).get(u.value or "")
            if m is not None and not m.exact and u.status == "filled":
                notes.insert(0, f"need {u.need_index}: {m.describe()}")
        filled = any(u.status == "filled" for u in updates)
        if conflict:
            return Verdict(
                "CONFLICTING", "conflicting", _with_notes("sources disagree on a need's value", notes), tuple(updates)
            ), _usage()
        if filled:
            return Verdict(
                "SUFFICIENT", "sufficient", _with_notes("observation supports a need's value", notes), tuple(updates)
            ), _usage()
        return Verdict(
            "INSUFFICIENT",
            "insufficient",
            _with_notes(f"{tool} did not contain the needed evidence", notes),
            tuple(updates),
        ), _usage()


def _with_notes(description: str, notes: list[str]) -> str:
    """The verdict's description with how values were read and what was kept unused (bounded)."""
    return description if not notes else f"{description} ({'; '.join(dict.fromkeys(notes))})"[:1200]


# --------------------------------------------------------------------------------------------------------------------
# Finalizer, answer critic, summarizer (ledger only)
# --------------------------------------------------------------------------------------------------------------------


class TeacherFinalizer:
    async def draft(self, r0: TaskContext, ledger: Ledger, messages: list[dict]) -> tuple[str, Usage]:
        return final_value(r0, ledger), _usage()


class TeacherAnswerCritic:
    async def check(
        self, r0: TaskContext, ledger: Ledger, answer: str, messages: list[dict]
    ) -> tuple[bool, str, Usage]:
        if not ready(ledger):
            open_b = [n.index for n in ledger.open_blocking()]
            return False, f"BLOCK: ledger not ready (open blocking needs {open_b})", _usage()
        expected = final_value(r0, ledger)
        if normalize_value(answer) != normalize_value(expected):
            return False, f"BLOCK: answer {answer!r} differs from the ledger's final value {expected!r}", _usage()
        return True, "PASS", _usage()


class TeacherSummarizer:
    """Memory arm: appends the new observation's first lines and keeps the most recent `max_chars` characters."""

    async def summarize(
        self, r0: TaskContext, summary: str, observation: str, max_chars: int, messages: list[dict]
    ) -> tuple[str, Usage]:
        head = " ".join(observation.strip().splitlines()[:3])
        merged = f"{summary} | {head}".strip(" |") if summary else head
        if len(merged) > max_chars:
            merged = merged[len(merged) - max_chars :]
        return merged, _usage()


def make_teacher_roles(task: Task) -> Roles:
    """Offline teacher roles for one task (privileged need parser and critic, honest planner; see module doc)."""
    return Roles(
        need_parser=TeacherNeedParser(task),
        planner=TeacherPlanner(),
        critic=TeacherCritic(task),
        finalizer=TeacherFinalizer(),
        answer_critic=TeacherAnswerCritic(),
        summarizer=TeacherSummarizer(),
        models={r: TEACHER_MODEL for r in ("need_parser", "planner", "critic", "finalizer", "answer_critic")},
    )


def teacher_needs_json(specs: list[NeedSpec]) -> str:
    """JSON of the declared needs (what an SFT need_parse row's completion holds)."""
    return json.dumps([{**s.__dict__, "depends_on": list(s.depends_on)} for s in specs], ensure_ascii=False)
