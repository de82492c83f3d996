"""Reducer fuzzing: >= 10,000 random event sequences (hypothesis) checking every ledger invariant in one pass.

Slow (about a minute on 2 cores), so it is marked `slow`: `make test` (and CI) run it; `pytest -m "not slow"` skips.
LEDGER_FUZZ_SEQUENCES overrides the count (for a quick local look)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from collect.ledger import TERMINAL_STATUSES, ready, replay, state_hash
from tests.helpers.ledger_events import event_seqs, states_of

SEQUENCES = int(os.environ.get("LEDGER_FUZZ_SEQUENCES", "10000"))


def check_invariants(events) -> None:
    states = states_of(events)
    # determinism: replaying the same events gives the same state and hash
    again = replay(list(events))
    assert again == states[-1] and state_hash(again) == state_hash(states[-1])
    for before, after in zip(states, states[1:], strict=False):
        for nb, na in zip(before.needs, after.needs, strict=True):
            # no silent overwrite: a value changes only from None or by resolving a conflict on that need
            if nb.value is not None and na.value != nb.value:
                assert {c.id for c in after.conflicts if c.need_index == nb.index and c.resolved} - {
                    c.id for c in before.conflicts if c.resolved
                }
            if nb.status == "unfillable":
                assert na.status == "unfillable"
        # atoms are append-only (evidence is never dropped)
        assert after.atoms[: len(before.atoms)] == before.atoms
    for s in states:
        for n in s.needs:
            assert n.status in ("unfilled", "partial", "filled", "unfillable")
        # a need is never both filled and unfillable: its slot is empty whenever it is unfillable
        for slot in s.slots:
            if s.needs[slot.need_index].status == "unfillable":
                assert slot.value is None
        if ready(s):
            assert not [n for n in s.needs if n.blocking and n.status != "filled"]
            assert not s.unresolved_conflicts()
        for i in s.actionable_indices():
            assert all(s.needs[d].status in TERMINAL_STATUSES for d in s.needs[i].depends_on)


@pytest.mark.slow
def test_ledger_invariants_hold_over_10k_random_event_sequences():
    seen = 0

    @settings(max_examples=SEQUENCES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(event_seqs())
    def run(events):
        nonlocal seen
        seen += 1
        check_invariants(events)

    run()
    # guards against a hypothesis configuration that silently runs fewer examples than the issue asks for
    assert seen >= SEQUENCES
