"""Hypothesis strategies: random valid reducer event sequences (shared by test_ledger_props and test_ledger_fuzz)."""

from __future__ import annotations

from hypothesis import strategies as st

from collect.ledger import (
    CLOSURE_LEVELS,
    NEED_ROLES,
    NEED_STATUSES,
    SOURCES,
    FinishBlocked,
    ModelError,
    NeedsDeclared,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    ObservationCommitted,
    ToolError,
    Verdict,
    reduce,
    replay,
)

TOOLS = ("web_search", "subtitle_grounding", "code_executor")
VALUES = st.sampled_from(["Paris", "paris", "Lyon", "1999", "1,999", "2001", None, ""])


@st.composite
def need_specs(draw):
    n = draw(st.integers(1, 5))
    return tuple(
        NeedSpec(
            need=f"need {i}",
            preferred_source=draw(st.sampled_from(SOURCES)),
            closure_level=draw(st.sampled_from(CLOSURE_LEVELS)),
            need_role=draw(st.sampled_from(NEED_ROLES)),
            depends_on=tuple(draw(st.lists(st.integers(-1, n), max_size=3))),
        )
        for i in range(n)
    )


@st.composite
def updates(draw, n):
    return NeedUpdate(
        need_index=draw(st.integers(-1, n)),
        status=draw(st.sampled_from(NEED_STATUSES)),
        value=draw(VALUES),
        filled_by=draw(st.sampled_from([None, *TOOLS])),
        evidence=draw(st.sampled_from(["", "quoted"])),
        revised_query_focus=draw(st.sampled_from([None, "new focus"])),
        revised_need_role=draw(st.sampled_from([None, *NEED_ROLES])),
        add_depends_on=tuple(draw(st.lists(st.integers(0, n), max_size=2))),
        entity=draw(st.sampled_from([None, "Acme"])),
    )


@st.composite
def event_seqs(draw):
    specs = draw(need_specs())
    n = len(specs)
    events = [NeedsDeclared(specs, unfillable_after=draw(st.integers(1, 3)))]
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["obs", "obs", "obs", "tool_error", "model_error", "finish_blocked"]))
        tool = draw(st.sampled_from(TOOLS))
        args = draw(st.sampled_from(['{"query":"a"}', '{"query":"b"}', "{}"]))
        tgt = draw(st.one_of(st.none(), st.integers(-1, n)))
        if kind == "obs":
            obs = NormalizedObservation(
                tool=tool,
                ok=True,
                summary="s",
                span=draw(st.one_of(st.none(), st.just((1.0, 2.5)))),
                items=("x",),
                asset_id=draw(st.sampled_from([None, "v1"])),
            )
            v = Verdict(
                draw(st.sampled_from(["SUFFICIENT", "INSUFFICIENT", "CONFLICTING"])),
                updates=tuple(draw(st.lists(updates(n), max_size=3))),
            )
            events.append(ObservationCommitted(tool, args, obs, v, target_need=tgt))
        elif kind == "tool_error":
            events.append(ToolError(tool, args, "boom", target_need=tgt))
        elif kind == "model_error":
            events.append(ModelError("unparseable", "bad", role=draw(st.sampled_from(["planner", "critic"]))))
        else:
            events.append(FinishBlocked("draft", "not ready"))
    return events


def states_of(events):
    """The ledger after each event (the first: after NeedsDeclared)."""
    s = replay(events[:1])
    out = [s]
    for e in events[1:]:
        s = reduce(s, e)
        out.append(s)
    return out
