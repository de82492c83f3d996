"""Task schema shared by the embedded world, the benchmark loaders and the runtime.

A `Task` is everything the runtime needs to run one question (R0 via `to_context`) plus what only audits and the
offline teacher may read (the gold answer and the gold evidence chain). Tasks are stored as a JSON list or as JSONL;
`load_tasks` reports a malformed file with the file, the task id and the offending field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from collect.ledger import ALL_TOOLS, Asset, Budget, TaskContext

ANSWER_FORMATS = {
    "open": "short answer (a name, phrase or value)",
    "number": "a number",
    "date": "a date",
    "multiple_choice": "one option letter (A, B, C or D)",
    "unanswerable": "short answer, or 'insufficient' when the evidence cannot be found",
}


class SubtitleLine(BaseModel):
    start: float
    end: float
    text: str


class AudioSegment(BaseModel):
    start: float
    end: float
    kind: Literal["speech", "event", "music"] = "speech"
    text: str


class ClipCaption(BaseModel):
    start: float
    end: float
    caption: str


class FrameNote(BaseModel):
    t: float
    description: str
    ocr: str = ""


class Tracks(BaseModel):
    """Annotation tracks: the offline stand-in for perceiving the media itself."""

    subtitles: list[SubtitleLine] = Field(default_factory=list)
    audio: list[AudioSegment] = Field(default_factory=list)
    clips: list[ClipCaption] = Field(default_factory=list)
    frames: list[FrameNote] = Field(default_factory=list)


class AssetSpec(BaseModel):
    id: str
    type: Literal["video", "audio", "image"]
    duration: float | None = None
    path: str | None = None
    tracks: Tracks = Field(default_factory=Tracks)


class GoldNeed(BaseModel):
    """One step of the gold evidence chain, in ledger vocabulary (collect.ledger.NeedSpec + the gold value)."""

    need: str
    need_role: Literal["anchor", "external_fact", "applicability", "compute"] = "external_fact"
    preferred_source: Literal["visual", "audio", "subtitle", "web", "computation"] = "web"
    closure_level: Literal["blocking", "supplementary"] = "blocking"
    depends_on: list[int] = Field(default_factory=list)
    query_focus: str = ""
    gold_value: str | None = None  # None: the chain cannot close here (unanswerable tasks)


class Task(BaseModel):
    id: str
    question: str
    answer: str
    answer_type: str = "open"
    options: list[str] = Field(default_factory=list)
    difficulty: Literal["Easy", "Medium", "Hard"] = "Medium"
    category: str = ""
    family: str = ""
    split: str = "test"
    assets: list[AssetSpec] = Field(default_factory=list)
    allowed_tools: list[str] = Field(default_factory=lambda: list(ALL_TOOLS))
    gold_chain: list[GoldNeed] = Field(default_factory=list)
    source: Literal["embedded", "omnigaia", "worldsense"] = "embedded"
    meta: dict[str, Any] = Field(default_factory=dict)

    def to_context(self, budget: Budget | None = None) -> TaskContext:
        """R0 for the runtime: what any planner may see (no gold answer, no gold chain)."""
        return TaskContext(
            task_id=self.id,
            question=self.question,
            assets=tuple(Asset(a.id, a.type, a.duration, a.path) for a in self.assets),
            answer_format=ANSWER_FORMATS.get(self.answer_type, "short answer"),
            options=tuple(self.options),
            allowed_tools=tuple(self.allowed_tools),
            budget=budget or Budget(),
        )

    def asset(self, asset_id: str | None) -> AssetSpec | None:
        for a in self.assets:
            if a.id == asset_id:
                return a
        return None


class TaskFileError(ValueError):
    """A task file that cannot be read; the message names the file, the task id and the field."""


def _field_of(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(root)"
    return f"{loc}: {first['msg']}"


def load_tasks(path: str | Path) -> list[Task]:
    """Read tasks from a JSON list or a JSONL file (one task object per line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TaskFileError(f"{path}: cannot read task file: {e}") from None
    stripped = text.lstrip()
    records: list[tuple[str, Any]] = []  # (position, record)
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path}: not valid JSON at line {e.lineno}: {e.msg}") from None
        records = [(f"item {i}", r) for i, r in enumerate(data)]
    else:
        for ln, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"line {ln}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise TaskFileError(f"{path}: line {ln} is not valid JSON: {e.msg}") from None
    tasks: list[Task] = []
    seen: set[str] = set()
    for pos, rec in records:
        if not isinstance(rec, dict):
            raise TaskFileError(
                f"{path}: {pos}: task id ?: field (root): expected an object, got {type(rec).__name__}"
            )
        tid = rec.get("id", "?")
        try:
            task = Task.model_validate(rec)
        except ValidationError as e:
            raise TaskFileError(f"{path}: {pos}: task id {tid!r}: field {_field_of(e)}") from None
        if task.id in seen:
            raise TaskFileError(f"{path}: {pos}: task id {task.id!r}: field id: duplicate task id")
        seen.add(task.id)
        tasks.append(task)
    return tasks


def save_tasks(tasks: list[Task], path: str | Path) -> None:
    """Write tasks as JSONL (or a JSON list when the path ends in .json)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps([t.model_dump() for t in tasks], ensure_ascii=False, indent=1), encoding="utf-8")
    else:
        with path.open("w", encoding="utf-8") as f:
            for t in tasks:
                f.write(json.dumps(t.model_dump(), ensure_ascii=False) + "\n")
