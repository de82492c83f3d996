"""Chat messages for every role, rendered deterministically from typed state.

The planner input is a pure function of (R0, ledger, latest observation text, arm-specific memory): no clock, no ids,
no dict-order surprises (the digest is JSON with a fixed key order). Harvest relies on this: the SFT prompt for a step
is exactly the `planner_input.messages` recorded for it; re-rendering from the recorded ledger gives the same bytes.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from collect.actions import REFERENCE_RULES
from collect.bounds import truncate  # one truncation rule for prompts and bounded role output
from collect.config import MAX_OBSERVATION_CHARS
from collect.ledger import Ledger, NormalizedObservation, TaskContext, render_digest
from collect.tools import FINISH_SCHEMA

PROMPTS = Path(__file__).with_name("prompts")


@cache
def load_prompt(name: str) -> str:
    """System prompt text from collect/roles/prompts/<name>.md (first line is the `# Role: x` marker)."""
    path = PROMPTS / f"{name}.md"
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} does not exist")
    return path.read_text(encoding="utf-8").strip()


def render_r0(r0: TaskContext) -> str:
    """Question, asset manifest, answer format, options: the immutable part every role sees."""
    lines = [f"Question: {r0.question}"]
    if r0.assets:
        lines.append("Assets:")
        for a in r0.assets:
            dur = f", {a.duration:g} s" if a.duration is not None else ""
            lines.append(f"- {a.id} ({a.type}{dur})")
    else:
        lines.append("Assets: none")
    lines.append(f"Answer format: {r0.answer_format}")
    if r0.options:
        lines.append("Options:")
        lines += [f"- {o}" for o in r0.options]
    return "\n".join(lines)


def tools_for(r0: TaskContext, schemas: list[dict]) -> list[dict]:
    """A(R0) as function schemas: the toolbox's schemas for the tools R0 offers, plus finish (always last)."""
    offered = set(r0.tools())
    out = [s for s in schemas if s.get("function", s).get("name") in offered and s["function"]["name"] != "finish"]
    return out + [FINISH_SCHEMA]


def _sys(name: str) -> dict:
    return {"role": "system", "content": load_prompt(name)}


def render_need_parser_messages(r0: TaskContext) -> list[dict]:
    return [_sys("need_parser"), {"role": "user", "content": render_r0(r0)}]


def render_planner_messages(
    r0: TaskContext,
    ledger: Ledger,
    latest_observation: str | None,
    arm: str = "ledger",
    *,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
    summary: str = "",
    history: list[dict] | None = None,
    refs: tuple[str, ...] = (),
) -> list[dict]:
    """The planner's chat input.

    ledger: system + one user message: R0, the rendered digest, the latest observation shown once (truncated).
    memory: system + one user message: R0, the rolling summary, the latest observation (no digest).
    react:  system + user R0, then `history` (assistant tool_call / tool messages accumulated by the loop).
    refs (ledger arm): the reference kinds offered (RuntimeConfig.references), one rule each after the prompt's own."""
    obs = truncate(latest_observation, max_observation_chars) if latest_observation else "(none yet)"
    if arm == "ledger":
        user = f"{render_r0(r0)}\n\nEvidence state digest:\n{render_digest(r0, ledger)}\n\nLatest observation:\n{obs}"
        system = _sys("planner")
        for kind in refs:
            system["content"] = system["content"].rstrip("\n") + "\n" + REFERENCE_RULES[kind]
        return [system, {"role": "user", "content": user}]
    if arm == "memory":
        user = f"{render_r0(r0)}\n\nSummary so far:\n{summary or '(empty)'}\n\nLatest observation:\n{obs}"
        return [_sys("planner_memory"), {"role": "user", "content": user}]
    if arm == "react":
        return [_sys("planner_react"), {"role": "user", "content": render_r0(r0)}] + list(history or [])
    raise ValueError(f"render_planner_messages: unknown arm {arm!r}")


def render_critic_messages(
    r0: TaskContext,
    ledger: Ledger,
    tool: str,
    arguments: dict,
    raw_observation: str,
    observation: NormalizedObservation,
    max_observation_chars: int = MAX_OBSERVATION_CHARS,
) -> list[dict]:
    call = json.dumps({"name": tool, "arguments": arguments}, sort_keys=True, ensure_ascii=False)
    norm = json.dumps(
        {"ok": observation.ok, "asset_id": observation.asset_id, "span": observation.span, "error": observation.error},
        ensure_ascii=False,
    )
    user = (
        f"{render_r0(r0)}\n\nEvidence state digest:\n{render_digest(r0, ledger)}\n\nTool call:\n{call}\n\n"
        f"Observation ({norm}):\n{truncate(raw_observation, max_observation_chars)}"
    )
    return [_sys("critic"), {"role": "user", "content": user}]


# The finalizer's and the answer critic's view of the evidence is bounded like the planner's: per need its atom that
# gave the filled value and its latest ones, each atom's content cut, the whole cut at MAX_EVIDENCE_CHARS.
MAX_ATOMS_PER_NEED = 3
MAX_EVIDENCE_CHARS = 4 * MAX_OBSERVATION_CHARS


def _shown_atoms(ledger: Ledger) -> tuple[list, int]:
    """(the atoms the evidence view lists, in ledger order; how many it leaves out): per need, the first atom whose
    value is the need's filled value, then its latest atoms, MAX_ATOMS_PER_NEED in all."""
    by_need: dict[int, list] = {}
    for a in ledger.atoms:
        by_need.setdefault(a.need_index, []).append(a)
    keep: set[int] = set()
    for ni, atoms in by_need.items():
        value = ledger.needs[ni].value if 0 <= ni < len(ledger.needs) else None
        support = [id(a) for a in atoms if value is not None and a.value == value][:1]
        latest = [id(a) for a in reversed(atoms) if id(a) not in support][: MAX_ATOMS_PER_NEED - len(support)]
        keep.update(support, latest)
    shown = [a for a in ledger.atoms if id(a) in keep]
    return shown, len(ledger.atoms) - len(shown)


def render_evidence(ledger: Ledger) -> str:
    """Answer-phase evidence summary: need values, atoms (truncated), unresolved conflicts."""
    lines = ["Needs:"]
    for n in ledger.needs:
        lines.append(
            f"- [{n.index}] {n.need} ({n.closure_level}, {n.status}): {n.value if n.value is not None else '-'}"
        )
    shown, left_out = _shown_atoms(ledger)
    lines.append(f"Evidence atoms ({left_out} earlier atoms not shown):" if left_out else "Evidence atoms:")
    for a in shown:
        lines.append(f"- need {a.need_index} = {a.value!r} from {a.source}: {a.content[:200]}")
    if not ledger.atoms:
        lines.append("- (none)")
    for c in ledger.unresolved_conflicts():
        lines.append(f"Unresolved conflict: {c.description}")
    return truncate("\n".join(lines), MAX_EVIDENCE_CHARS)


def render_finalizer_messages(r0: TaskContext, ledger: Ledger) -> list[dict]:
    return [_sys("finalizer"), {"role": "user", "content": f"{render_r0(r0)}\n\n{render_evidence(ledger)}"}]


def render_answer_critic_messages(r0: TaskContext, ledger: Ledger, answer: str) -> list[dict]:
    user = f"{render_r0(r0)}\n\n{render_evidence(ledger)}\n\nProposed answer: {answer}"
    return [_sys("answer_critic"), {"role": "user", "content": user}]


def render_summarizer_messages(
    r0: TaskContext, summary: str, observation: str, max_chars: int, max_observation_chars: int = MAX_OBSERVATION_CHARS
) -> list[dict]:
    user = (
        f"{render_r0(r0)}\n\nCurrent summary:\n{summary or '(empty)'}\n\nNew observation:\n"
        f"{truncate(observation, max_observation_chars)}\n\nCharacter limit: {max_chars}"
    )
    return [_sys("summarizer"), {"role": "user", "content": user}]
