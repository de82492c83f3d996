"""Property tests of the reducer (collect/ledger.py) over random valid event sequences.

LEDGER_FUZZ_EXAMPLES sets hypothesis' max_examples (default 120 keeps this file well under 15 s; CI can run 10000).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collect.ledger import (
    CLOSURE_LEVELS,
    NEED_ROLES,
    NEED_STATUSES,
    SOURCES,
    TERMINAL_STATUSES,
    FinishBlocked,
    ModelError,
    NeedsDeclared,
    NeedSpec,
    NeedUpdate,
    NormalizedObservation,
    ObservationCommitted,
    ToolError,
    Verdict,
    event_from_dict,
    event_to_dict,
    ready,
    reduce,
    replay,
    state_hash,
)

EXAMPLES = int(os.environ.get("LEDGER_FUZZ_EXAMPLES", "120"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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


def _states(events):
    s = replay(events[:1])
    out = [s]
    for e in events[1:]:
        s = reduce(s, e)
        out.append(s)
    return out


@SETTINGS
@given(event_seqs())
def test_replay_is_deterministic_in_state_and_hash(events):
    a, b = replay(events), replay(list(events))
    assert a == b and state_hash(a) == state_hash(b)


@SETTINGS
@given(event_seqs())
def test_event_dict_round_trip_is_exact(events):
    back = [event_from_dict(event_to_dict(e)) for e in events]
    assert back == events
    assert state_hash(replay(back)) == state_hash(replay(events))


@SETTINGS
@given(event_seqs())
def test_a_value_only_changes_from_none_or_by_resolving_a_conflict(events):
    states = _states(events)
    for before, after in zip(states, states[1:], strict=False):
        for nb, na in zip(before.needs, after.needs, strict=True):
            if nb.value is not None and na.value != nb.value:
                resolved_now = {c.id for c in after.conflicts if c.need_index == nb.index and c.resolved} - {
                    c.id for c in before.conflicts if c.resolved
                }
                assert resolved_now, f"need {nb.index}: {nb.value!r} -> {na.value!r} without resolving a conflict"


@SETTINGS
@given(event_seqs())
def test_actionable_and_blocked_respect_depends_on(events):
    for s in _states(events):
        act, blk = set(s.actionable_indices()), set(s.blocked_indices())
        assert not act & blk
        assert act | blk == {n.index for n in s.needs if n.open}
        for i in act:
            assert all(s.needs[d].status in TERMINAL_STATUSES for d in s.needs[i].depends_on)
        for i in blk:
            assert any(s.needs[d].status not in TERMINAL_STATUSES for d in s.needs[i].depends_on)
        for n in s.needs:
            assert all(d < n.index for d in n.depends_on), "dependencies must point to earlier needs (a DAG)"


@SETTINGS
@given(event_seqs())
def test_ready_implies_no_open_blocking_need_and_no_unresolved_conflict(events):
    for s in _states(events):
        if ready(s):
            assert not [n for n in s.needs if n.blocking and n.status != "filled"]
            assert not s.unresolved_conflicts()
            assert all(slot.value is not None for slot in s.slots)


@SETTINGS
@given(event_seqs())
def test_unfillable_is_terminal_and_never_has_a_filled_slot(events):
    states = _states(events)
    for before, after in zip(states, states[1:], strict=False):
        for nb, na in zip(before.needs, after.needs, strict=True):
            if nb.status == "unfillable":
                assert na.status == "unfillable"
    for s in states:
        for slot in s.slots:
            nd = s.needs[slot.need_index]
            if nd.status == "unfillable":
                assert slot.value is None
            if nd.status == "filled":
                assert nd.value is not None and slot.value == nd.value
