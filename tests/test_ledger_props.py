"""Property tests of the reducer (collect/ledger.py) over random valid event sequences.

LEDGER_FUZZ_EXAMPLES sets hypothesis' max_examples (default 120 keeps this file well under 15 s; CI can run 10000).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from collect.ledger import (
    TERMINAL_STATUSES,
    event_from_dict,
    event_to_dict,
    ready,
    replay,
    state_hash,
)
from tests.helpers.ledger_events import event_seqs, states_of

EXAMPLES = int(os.environ.get("LEDGER_FUZZ_EXAMPLES", "120"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


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
    states = states_of(events)
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
    for s in states_of(events):
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
    for s in states_of(events):
        if ready(s):
            assert not [n for n in s.needs if n.blocking and n.status != "filled"]
            assert not s.unresolved_conflicts()
            assert all(slot.value is not None for slot in s.slots)


@SETTINGS
@given(event_seqs())
def test_unfillable_is_terminal_and_never_has_a_filled_slot(events):
    states = states_of(events)
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
