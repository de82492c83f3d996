"""Role interfaces. Every role is async and returns its result plus a `Usage` record.

Roles never change the ledger: they return values (needs, an action reply, a verdict, an answer) that the loop turns
into events for the reducer. Roles receive the exact chat `messages` the loop rendered for them; LLM-backed roles send
them, offline roles may ignore them and read the typed ledger instead (the teacher is honest about being privileged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from collect.ledger import Ledger, NeedSpec, NormalizedObservation, TaskContext, Verdict
from collect.llm import Usage  # defined with the chat client (collect.llm imports nothing of roles); re-exported

__all__ = [
    "AnswerCritic",
    "EvidenceCritic",
    "Finalizer",
    "NeedParser",
    "Planner",
    "PlannerReply",
    "Roles",
    "Summarizer",
    "Usage",
]


@dataclass
class PlannerReply:
    """Raw planner output: text content and/or native tool calls ({"name", "arguments"} dicts or OpenAI shape)."""

    text: str
    tool_calls: list[dict]
    usage: Usage


class NeedParser(Protocol):
    async def parse(self, r0: TaskContext, messages: list[dict]) -> tuple[list[NeedSpec], Usage]: ...


class Planner(Protocol):
    async def decide(
        self,
        messages: list[dict],
        tools: list[dict],
        *,
        r0: TaskContext,
        ledger: Ledger,
    ) -> PlannerReply: ...


class EvidenceCritic(Protocol):
    async def judge(
        self,
        r0: TaskContext,
        ledger: Ledger,
        tool: str,
        arguments: dict,
        observation: NormalizedObservation,
        messages: list[dict],
    ) -> tuple[Verdict, Usage]: ...


class Finalizer(Protocol):
    async def draft(self, r0: TaskContext, ledger: Ledger, messages: list[dict]) -> tuple[str, Usage]: ...


class AnswerCritic(Protocol):
    async def check(
        self, r0: TaskContext, ledger: Ledger, answer: str, messages: list[dict]
    ) -> tuple[bool, str, Usage]: ...

    # returns (passed, revision_hint / diagnosis, usage)


class Summarizer(Protocol):
    """Memory arm only: rolling natural-language summary, capped at `max_chars`."""

    async def summarize(
        self, r0: TaskContext, summary: str, observation: str, max_chars: int, messages: list[dict]
    ) -> tuple[str, Usage]: ...


@dataclass
class Roles:
    need_parser: NeedParser
    planner: Planner
    critic: EvidenceCritic
    finalizer: Finalizer
    answer_critic: AnswerCritic
    summarizer: Summarizer | None = None
    models: dict = field(default_factory=dict)  # role name -> model name (recorded in trajectories)
