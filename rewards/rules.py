"""The two rule-based reward dimensions (paper v3 Appendix F.3): action validity and termination consistency.

Both are computed from the tool schemas and the recorded ledger snapshot alone, with no model, using the same parser,
schema validator and readiness predicate as the runtime (collect.actions, collect.ledger.ready), so "valid" and
"ready" mean one thing in collection, training and evaluation.

TRL reward contract: ``f(completions, **kwargs) -> list[float | None]``; dataset columns (``tools``, ``ledger``, ...)
arrive as keyword lists aligned with ``completions``.
"""

from __future__ import annotations

import json
from typing import Any

from collect.actions import (
    Action,
    ActionError,
    offered_refs,
    parse_action,
    resolve_refs,
    validate_action,
)
from collect.ledger import Ledger, ledger_from_dict, ready


def completion_text(completion: Any) -> str:
    """The text of one completion: a plain string, or TRL's conversational ``[{"role": "assistant", ...}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion if isinstance(m, dict))
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    raise TypeError(f"completion of type {type(completion).__name__}; expected str or a list of messages")


def completion_tool_calls(completion: Any) -> list | None:
    """Native ``tool_calls`` of a conversational completion (when a parser produced them), else None."""
    if isinstance(completion, list):
        calls = [tc for m in completion if isinstance(m, dict) for tc in (m.get("tool_calls") or [])]
        return calls or None
    return None


def load_json_column(value: Any, column: str) -> Any:
    """Dataset columns hold JSON strings (Arrow-friendly); accept an already-decoded value too."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"rl_states column {column!r} is not valid JSON: {e}: {value[:120]!r}") from None
    return value


def parse_candidate(completion: Any) -> Action | None:
    """The one action a completion expresses, or None when it does not parse as exactly one call."""
    try:
        return parse_action(completion_text(completion), completion_tool_calls(completion))
    except ActionError:
        return None


def check_candidate(
    completion: Any, tools: list[dict], ledger: Ledger | None = None, refs: tuple[str, ...] = ()
) -> tuple[Action | None, str | None]:
    """(action, None) when the completion is a valid action for this tool set, else (action-or-None, error kind).
    refs (the reference kinds the state's prompt offers: collect.actions.offered_refs) are resolved first against the
    state's `ledger`, as the runtime does, and the resolved action is returned; a reference the ledger cannot fill
    makes it invalid."""
    try:
        action = parse_action(completion_text(completion), completion_tool_calls(completion))
    except ActionError as e:
        return None, e.kind
    try:
        action = resolve_refs(action, ledger, refs)
        validate_action(action, tools)
    except ActionError as e:
        return action, e.kind
    return action, None


def ledger_of(value: Any) -> Ledger:
    """Rebuild the ledger snapshot the planner saw from the ``ledger`` column (Ledger.to_dict() JSON)."""
    return ledger_from_dict(load_json_column(value, "ledger"))


def valid(completions: list, tools: list, **kwargs) -> list[float | None]:
    """1 when the completion parses as exactly one action, the tool is in this state's tool set and the arguments
    satisfy its JSON schema and what the tools refuse beyond it (collect.actions.validate_action: a time_range that
    ends before it starts, a blank query or code); else 0. Guards the action format against drift during RL. Where the
    state's prompt (``prompts``, as GRPO passes it) offers references, they are resolved against the ``ledger`` column
    first (a reference the ledger cannot fill: 0)."""
    out: list[float | None] = []
    prompts, ledgers = kwargs.get("prompts"), kwargs.get("ledger")
    for i, (completion, tools_json) in enumerate(zip(completions, tools, strict=True)):
        schemas = load_json_column(tools_json, "tools")
        refs = offered_refs(prompts[i]) if prompts is not None and ledgers is not None else ()
        _, err = check_candidate(completion, schemas, ledger_of(ledgers[i]) if refs else None, refs)
        out.append(1.0 if err is None else 0.0)
    return out


def gate(completions: list, ledger: list, **kwargs) -> list[float | None]:
    """0 when the completion selects ``finish`` while the ledger is not ready (an open blocking need, an empty slot or
    an unresolved conflict: collect.ledger.ready, the runtime finish gate), else 1. Targets premature convergence."""
    out: list[float | None] = []
    for completion, ledger_json in zip(completions, ledger, strict=True):
        action = parse_candidate(completion)
        if action is not None and action.name == "finish" and not ready(ledger_of(ledger_json)):
            out.append(0.0)
        else:
            out.append(1.0)
    return out
