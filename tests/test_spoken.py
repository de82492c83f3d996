"""Task files as people write them (issue 56), on the hand-written tests/data/spoken/tasks.jsonl: 16 audio-led tasks
with their own documents (two assets needed together, unit arithmetic with rounding, dates written one way in the
corpus and another in the answer, multiple choice, unanswerable tasks, a look-alike distractor in every task).

One test per class of the issue: dates and quantities read by maintained parsers, a declared outdated value never
fills a need, conflicting values are recorded as a conflict (and an unresolved one is marked and ends "insufficient"
because of it), the search stems. Property test: the declaration order of alt values never changes an outcome. The
offline teacher on this file at 17c4670 (before these fixes) got 4 of 16 (docs/world.md names the classes)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collect.__main__ import main
from collect.config import RuntimeConfig, ToolsConfig
from collect.ledger import NeedsDeclared, NormalizedObservation, ObservationCommitted, canonical_args, initial_ledger
from collect.ledger import reduce as reduce_ledger
from collect.loop import run_task
from collect.tasks import load_tasks
from collect.teacher import make_teacher_roles
from collect.tools import ToolBox

SPOKEN = Path(__file__).resolve().parent / "data/spoken/tasks.jsonl"
TASKS = {t.id: t for t in load_tasks(SPOKEN)}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, dict]:
    """The real collect engine on the file (no corpus: every task brings its own documents)."""
    out = tmp_path_factory.mktemp("spoken") / "out"
    argv = ["--config", "configs/collect/embedded.yaml", "--tasks", str(SPOKEN), "--split", "all", "--out", str(out)]
    assert main([*argv, "--no-harvest", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_tasks"] == 16 and summary["scoring_mode"] == "robust"
    return {r["task_id"]: r for r in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines())}


def _descriptions(rec: dict) -> str:
    return " ".join((s.get("verdict") or {}).get("description", "") for s in rec["steps"])


def _run(task, tools: ToolsConfig | None = None) -> dict:
    box = ToolBox(task, task.to_context(), tools or ToolsConfig())
    return asyncio.run(run_task(task, make_teacher_roles(task), box, RuntimeConfig()))


def test_the_teacher_answers_every_spoken_task(records):
    wrong = {t: (r["answer"], r["gold_answer"]) for t, r in records.items() if not r["correct"]}
    assert len(records) == 16 and not wrong
    for tid in ("sp-07-galleries", "sp-10-tower-height", "sp-13-past-end"):
        assert records[tid]["answer"] == "insufficient" and records[tid]["outcome"] == "insufficient"


@pytest.mark.parametrize(
    "tid, span",
    [
        ("sp-01-maiden", "5th of March 2019"),  # an ordinal with "of"; the answer is ISO
        ("sp-02-lantern", "17 Sept 2016"),  # an abbreviated month with a dot; the options are written out
        ("sp-03-tide-mill", "21.06.1987"),  # a dotted numeric date on a plaque photo
    ],
)
def test_class_1_dates_are_read_by_dateparser_and_the_trajectory_says_so(records, tid, span):
    rec = records[tid]
    assert rec["correct"], (rec["answer"], rec["gold_answer"])
    assert f"found as {span!r}" in _descriptions(rec) and "(dateparser)" in _descriptions(rec)


@pytest.mark.parametrize(
    "tid, span",
    [
        ("sp-04-fast-ferry", "ninety kilometres per hour"),  # a rate in words, "an hour"
        ("sp-05-crossing-minutes", "36 kph"),  # kph; then minutes computed and rounded
        ("sp-06-members", "Forty percent"),  # "per cent" written out
        ("sp-14-loop", "14 km"),  # the gold written in words, the page in digits
        ("sp-16-pilot-boat", "twenty-two knots"),
    ],
)
def test_class_2_quantities_are_read_by_quantulum3_and_the_trajectory_says_so(records, tid, span):
    rec = records[tid]
    assert rec["correct"], (rec["answer"], rec["gold_answer"])
    assert f"found as {span!r}" in _descriptions(rec) and "(quantulum3)" in _descriptions(rec)


def test_class_3_an_outdated_value_never_fills_a_need(records):
    # the only evidence is an archived listing: it is kept as stale evidence and the task ends insufficient
    led = records["sp-07-galleries"]["final_ledger"]
    assert led["needs"][1]["status"] != "filled" and led["needs"][1]["value"] is None
    (stale,) = [a for a in led["atoms"] if a["need_index"] == 1]
    assert stale["value"] == "14" and stale["content"].startswith("[outdated, not used]")
    assert "declares outdated" in _descriptions(records["sp-07-galleries"])
    # beside the current value written in words, the outdated digits lose
    led = records["sp-08-lark-speed"]["final_ledger"]
    assert led["needs"][1]["value"] == "82 km/h" and not any(a["value"] == "74 km/h" for a in led["atoms"])


def test_class_3_the_critic_keeps_an_outdated_value_unused_when_it_is_alone():
    task = TASKS["sp-08-lark-speed"]
    roles, r0 = make_teacher_roles(task), task.to_context()
    specs, _ = asyncio.run(roles.need_parser.parse(r0, []))
    led = reduce_ledger(initial_ledger(), NeedsDeclared(tuple(specs)))
    line = "Archived 2011 listing: Brisa Lark, top speed 74 km/h."
    obs = NormalizedObservation(tool="web_search", ok=True, summary=line, items=(line,))
    args = {"query": "Brisa Lark top speed", "need_index": 1}
    verdict, _ = asyncio.run(roles.critic.judge(r0, led, "web_search", args, obs, []))
    assert [(u.status, u.value) for u in verdict.updates] == [("partial", "74 km/h")]
    led = reduce_ledger(led, ObservationCommitted("web_search", canonical_args(args), obs, verdict, 1))
    assert led.needs[1].status == "partial" and led.needs[1].value is None and led.atoms[-1].value == "74 km/h"


def test_class_4_two_conflicting_values_are_a_conflict_that_a_third_value_settles_twice_confirmed(records):
    rec = records["sp-09-choir-founded"]
    (conflict,) = rec["final_ledger"]["conflicts"]
    atoms = {a["id"]: a for a in rec["final_ledger"]["atoms"]}
    sides = [atoms[i]["value"] for i in conflict["atom_ids"][:2]]
    assert sorted(sides) == ["1952", "1958"] and conflict["resolved"]
    assert atoms[conflict["resolved_by"]]["value"] == "1955" and rec["answer"] == "1955"


def test_class_4_an_unresolved_conflict_ends_insufficient_because_of_the_recorded_conflict(records):
    rec = records["sp-10-tower-height"]
    (conflict,) = rec["final_ledger"]["conflicts"]
    atoms = {a["id"]: a for a in rec["final_ledger"]["atoms"]}
    assert not conflict["resolved"] and sorted(atoms[i]["value"] for i in conflict["atom_ids"]) == ["38 m", "44 m"]
    assert rec["outcome"] == "insufficient" and rec["answer"] == "insufficient"
    # after the conflict the media and an official-record search were consulted, and none settled it
    after = [s["action"] for s in rec["steps"]][2:]
    assert [a["name"] for a in after] == ["subtitle_grounding", "audio_scout", "web_search"]
    assert after[-1]["arguments"]["query"].endswith("official record")


def test_class_5_the_search_stems_and_without_stemming_the_need_spends_its_retries():
    task = TASKS["sp-11-boathouse"]
    assert _run(task)["answer"] == "14"
    rec = _run(task, ToolsConfig(web_stemmer=""))
    searches = [s for s in rec["steps"] if s["action"]["name"] == "web_search"]
    assert rec["outcome"] == "insufficient" and len(searches) == 3  # every query variant spent


DECOYS = [{"value": "1899", "kind": "conflicting"}, {"value": "3 m", "kind": "outdated"}]  # in no document


@settings(max_examples=12, deadline=None)
@given(
    tid=st.sampled_from(["sp-07-galleries", "sp-08-lark-speed", "sp-09-choir-founded", "sp-10-tower-height"]),
    data=st.data(),
)
def test_the_declaration_order_of_alt_values_never_changes_an_outcome(tid, data):
    task = TASKS[tid]
    alts = task.meta["alt_values"]["1"] + DECOYS
    order = data.draw(st.permutations(alts))
    shuffled = task.model_copy(update={"meta": {**task.meta, "alt_values": {"1": order}}})
    base, other = _run(task), _run(shuffled)
    assert (other["answer"], other["outcome"]) == (base["answer"], base["outcome"]), order
    assert other["final_ledger"]["conflicts"] == base["final_ledger"]["conflicts"]
    if task.answer == "insufficient":
        assert other["outcome"] == "insufficient"
    else:
        assert other["answer"] == task.answer
