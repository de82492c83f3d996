"""Task schema shared by the embedded world, the benchmark loaders and the runtime.

A `Task` is everything the runtime needs to run one question (R0 via `to_context`) plus what only audits and the
offline teacher may read (the gold answer and the gold evidence chain). Tasks are stored as a JSON list or as JSONL;
`load_tasks` reports a malformed file with the file, the task id and the offending field.

The schema is strict (docs/world.md, "Task files"): unknown keys are errors (a typo is never dropped silently), enums
are closed, a multiple-choice gold is one of the option letters, `allowed_tools` names known tools, gold-chain
`depends_on` indices are in range and acyclic, a compute formula uses only the values of its dependencies and known
helpers, asset and document ids are unique within a task, task ids within a file (also ignoring case) and carry no
surrounding whitespace, timed track entries do not end before they start. Files are read incrementally under
`TaskLimits` (file size, record size, question and document length), so a huge file or line is refused early with
bounded memory. `select_tasks` applies a split and a limit and refuses a selection that is empty.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import difflib
import json
import os
import re
import string
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from collect import jsonio
from collect.actions import focus_formula
from collect.bounds import json_depth
from collect.compute import helper_names
from collect.ledger import ALL_TOOLS, INSUFFICIENT, Asset, Budget, TaskContext, normalize_value

ANSWER_FORMATS = {
    "open": "short answer (a name, phrase or value)",
    "number": "a number",
    "date": "a date",
    "multiple_choice": "one option letter (A, B, C or D)",
    "unanswerable": "short answer, or 'insufficient' when the evidence cannot be found",
}
AnswerType = Literal["open", "number", "date", "multiple_choice", "unanswerable"]
SPLITS = ("train", "dev", "test")
OPTION_LETTERS = string.ascii_uppercase


class _Strict(BaseModel):
    """Unknown keys are errors: a misspelt field (`option` for `options`) must fail, never be dropped. Numbers are
    finite: NaN, Infinity (and 1e400, which json reads as inf) are refused, since every file written holds strict
    JSON (collect.jsonio)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SubtitleLine(_Strict):
    start: float
    end: float
    text: str


class AudioSegment(_Strict):
    start: float
    end: float
    kind: Literal["speech", "event", "music"] = "speech"
    text: str


class ClipCaption(_Strict):
    start: float
    end: float
    caption: str


class FrameNote(_Strict):
    t: float
    description: str
    ocr: str = ""


class Tracks(_Strict):
    """Annotation tracks: the offline stand-in for perceiving the media itself."""

    subtitles: list[SubtitleLine] = Field(default_factory=list)
    audio: list[AudioSegment] = Field(default_factory=list)
    clips: list[ClipCaption] = Field(default_factory=list)
    frames: list[FrameNote] = Field(default_factory=list)


class AssetSpec(_Strict):
    id: str
    type: Literal["video", "audio", "image"]
    duration: float | None = None
    path: str | None = None
    tracks: Tracks = Field(default_factory=Tracks)


class GoldNeed(_Strict):
    """One step of the gold evidence chain, in ledger vocabulary (collect.ledger.NeedSpec + the gold value)."""

    need: str
    need_role: Literal["anchor", "external_fact", "applicability", "compute"] = "external_fact"
    preferred_source: Literal["visual", "audio", "subtitle", "web", "computation"] = "web"
    closure_level: Literal["blocking", "supplementary"] = "blocking"
    depends_on: list[int] = Field(default_factory=list)
    query_focus: str = ""
    gold_value: str | None = None  # None: the chain cannot close here (unanswerable tasks)
    # The sources conflict and nothing settles it: gold_value is null and meta.alt_values declares the need's
    # conflicting values (at least two); the runtime ends "insufficient" because of the recorded conflict.
    unresolved_conflict: bool = False

    @field_validator("gold_value")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("gold_value is blank; write the value, or null where the chain cannot close")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        d = handler(self)  # the marking is left out when unset: the world's JSON (pinned) is unchanged
        if isinstance(d, dict) and not d.get("unresolved_conflict"):
            d.pop("unresolved_conflict", None)
        return d


class AltValue(_Strict):
    """One known wrong value of a need (`meta.alt_values`): `outdated` (true once, superseded: stale evidence) or
    `conflicting` (a source that contradicts the gold: a conflict a third source must settle)."""

    value: str = Field(min_length=1)
    kind: Literal["outdated", "conflicting"]


class Document(_Strict):
    """One web document of an external corpus (docs/world.md, "External tasks with evidence"): what `web_search`
    (bm25 backend) indexes as `title + text` and returns as {title, link: url, snippet: text, date}."""

    id: str = ""
    url: str = Field(min_length=1)
    title: str = ""
    text: str = Field(min_length=1)
    date: str = ""


class Task(_Strict):
    id: str = Field(min_length=1)
    question: str
    answer: str
    answer_type: AnswerType = "open"
    options: list[str] = Field(default_factory=list)
    difficulty: Literal["Easy", "Medium", "Hard"] = "Medium"
    category: str = ""
    family: str = ""
    split: Literal["train", "dev", "test"] = "test"
    assets: list[AssetSpec] = Field(default_factory=list)
    allowed_tools: list[str] = Field(default_factory=lambda: list(ALL_TOOLS))
    gold_chain: list[GoldNeed] = Field(default_factory=list)
    documents: list[Document] = Field(default_factory=list)  # this task's own web documents (added to the corpus)
    source: Literal["embedded", "omnigaia", "worldsense"] = "embedded"
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("meta")
    @classmethod
    def _finite_meta(cls, meta: dict[str, Any]) -> dict[str, Any]:
        bad = jsonio.nonfinite_at(meta, dotted=True)
        if bad is not None:
            raise ValueError(f"meta.{bad[0]}: {bad[1]!r} is not a finite number (task values are written as JSON)")
        return meta

    @field_validator("allowed_tools")
    @classmethod
    def _known_tools(cls, tools: list[str]) -> list[str]:
        for i, name in enumerate(tools):
            if name not in ALL_TOOLS:
                raise ValueError(f"allowed_tools.{i}: unknown tool {name!r}; known tools: {', '.join(ALL_TOOLS)}")
        return tools

    @field_validator("answer")
    @classmethod
    def _answer_given(cls, v: str) -> str:
        if not v.strip():
            raise ValueError('answer: the gold answer is empty; write it ("insufficient" for a task without one)')
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Task:
        # Messages start with the field they are about; _describe() turns them into "field <name>: <what>".
        if self.answer_type == "multiple_choice":
            if len(self.options) < 2:
                raise ValueError(f"options: a multiple_choice task needs at least 2 options, got {len(self.options)}")
            if len(self.options) > len(OPTION_LETTERS):
                raise ValueError(f"options: at most {len(OPTION_LETTERS)} options, got {len(self.options)}")
            letters = OPTION_LETTERS[: len(self.options)]
            if self.answer.strip().upper() not in letters or len(self.answer.strip()) != 1:
                hint = ""
                for i, opt in enumerate(self.options):
                    if self.answer.strip() == opt.strip():
                        hint = f" ({self.answer!r} is the text of option {letters[i]}; give its letter)"
                raise ValueError(
                    f"answer: a multiple_choice gold must be one of the option letters {', '.join(letters)}, "
                    f"got {self.answer!r}{hint}"
                )
        elif self.options:
            raise ValueError(f"options: only a multiple_choice task has options (answer_type is {self.answer_type!r})")
        if self.id != self.id.strip():
            raise ValueError(f"id: {self.id!r} has leading or trailing whitespace (ids are compared exactly)")
        seen: set[str] = set()
        for i, a in enumerate(self.assets):
            if a.id in seen:
                raise ValueError(f"assets.{i}.id: duplicate asset id {a.id!r}")
            seen.add(a.id)
            for track in ("subtitles", "audio", "clips"):  # a window that ends before it starts never matches
                for j, span in enumerate(getattr(a.tracks, track)):
                    if not span.end >= span.start:
                        raise ValueError(
                            f"assets.{i}.tracks.{track}.{j}.end: the entry ends at {span.end:g} s, before it starts "
                            f"({span.start:g} s)"
                        )
        doc_ids: set[str] = set()
        for i, doc in enumerate(self.documents):
            if doc.id and doc.id in doc_ids:
                raise ValueError(f"documents.{i}.id: duplicate document id {doc.id!r} in this task's documents")
            doc_ids.add(doc.id)
        n = len(self.gold_chain)
        for i, need in enumerate(self.gold_chain):
            for d in need.depends_on:
                if not 0 <= d < n:
                    raise ValueError(
                        f"gold_chain.{i}.depends_on: index {d} is out of range (the chain has {n} needs: 0..{n - 1})"
                    )
                if d == i:
                    raise ValueError(f"gold_chain.{i}.depends_on: need {i} depends on itself")
        cycle = _find_cycle([need.depends_on for need in self.gold_chain])
        if cycle:
            path = " -> ".join(str(c) for c in cycle)
            raise ValueError(f"gold_chain.{cycle[0]}.depends_on: dependency cycle {path}")
        for i, need in enumerate(self.gold_chain):
            if (formula := focus_formula(need.query_focus)) is not None:
                _check_formula(f"gold_chain.{i}.query_focus", formula, need.depends_on)
        self._check_alt_values()
        return self

    def _check_alt_values(self) -> None:
        """`meta.alt_values` ({"<need index>": [{"value", "kind"}]}) and the `unresolved_conflict` marking."""
        raw = self.meta.get("alt_values")
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            got = type(raw).__name__
            raise ValueError(f'meta.alt_values: expected an object {{"<need index>": [...]}}, got {got}')
        n = len(self.gold_chain)
        alts: dict[int, list[AltValue]] = {}
        for key, entries in raw.items():
            if not (isinstance(key, str) and key.isdigit() and int(key) < n):
                raise ValueError(f"meta.alt_values.{key}: not a need index of gold_chain (0..{n - 1})")
            if not isinstance(entries, list):
                raise ValueError(f"meta.alt_values.{key}: expected a list of {{value, kind}}")
            i = int(key)
            alts[i] = []
            for j, e in enumerate(entries):
                try:
                    alts[i].append(AltValue.model_validate(e))
                except ValidationError as err:
                    first = err.errors()[0]
                    where = ".".join(str(p) for p in first["loc"])
                    what = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
                    where = f".{where}" if where else ""
                    raise ValueError(
                        f"meta.alt_values.{key}.{j}{where}: {what} (an alt value is {{value, kind: outdated|"
                        "conflicting})"
                    ) from None
                gold = self.gold_chain[i].gold_value
                if gold is not None and normalize_value(gold) == normalize_value(alts[i][-1].value):
                    raise ValueError(f"meta.alt_values.{key}.{j}.value: {gold!r} is the need's gold_value")
        for i, need in enumerate(self.gold_chain):
            if not need.unresolved_conflict:
                continue
            sides = {normalize_value(a.value) for a in alts.get(i, []) if a.kind == "conflicting"}
            if need.gold_value is not None:
                raise ValueError(
                    f"gold_chain.{i}.unresolved_conflict: the need has gold_value {need.gold_value!r}; an unresolved "
                    "conflict has none (null), or drop the marking and declare the settling source"
                )
            if len(sides) < 2:
                raise ValueError(
                    f"gold_chain.{i}.unresolved_conflict: declare the conflicting values in meta.alt_values.{i} "
                    f"(at least two of kind conflicting; found {len(sides)})"
                )
            if need.closure_level == "blocking" and normalize_value(self.answer) != INSUFFICIENT:
                raise ValueError(
                    f"gold_chain.{i}.unresolved_conflict: a blocking need nothing settles leaves the task without an "
                    f"answer; its answer must be {INSUFFICIENT!r}, got {self.answer!r}"
                )

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # `documents` is left out of a dump when empty, so the tasks of every older file and of the embedded world
        # serialize exactly as before the key existed (tests/test_world.py pins the world's JSON).
        d = handler(self)
        if isinstance(d, dict) and not d.get("documents"):
            d.pop("documents", None)
        return d

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


_VALUE_NAME = re.compile(r"v(\d+)")


def _check_formula(field: str, formula: str, depends_on: list[int]) -> None:
    """A compute formula ("compute: <expr>" focus) is a Python expression over v<K> (the value of need K, which the
    program gets only for K in depends_on: collect.compute.program), the compute helpers and builtins. Anything
    else would surface as a SyntaxError or NameError inside the sandbox and end the task "insufficient"."""
    try:
        tree = ast.parse(formula, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"{field}: the formula {formula!r} is not a Python expression ({e.msg})") from None

    bound = set()  # names the formula binds itself: comprehension targets, lambda parameters, := targets
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension | ast.NamedExpr):
            bound.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Lambda):
            bound.update(a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} - bound
    for name in sorted(names):
        m = _VALUE_NAME.fullmatch(name)
        if m and int(m.group(1)) not in depends_on:
            raise ValueError(
                f"{field}: the formula uses {name}, the value of need {m.group(1)}, but this need has depends_on "
                f"{depends_on}: only those values are given to it; add {m.group(1)} to depends_on or fix the formula"
            )
        if not m and name not in helper_names() and not hasattr(builtins, name):
            values = ", ".join(f"v{d}" for d in depends_on) or "none"
            raise ValueError(
                f"{field}: the formula uses {name!r}, which is neither a value ({values}) nor a compute helper "
                f"({', '.join(sorted(helper_names()))}) nor a Python builtin"
            )


def _find_cycle(deps: list[list[int]]) -> list[int] | None:
    """A dependency cycle among in-range indices as [a, b, ..., a], or None."""
    state = [0] * len(deps)  # 0 new, 1 on the stack, 2 done
    stack: list[int] = []

    def visit(i: int) -> list[int] | None:
        state[i] = 1
        stack.append(i)
        for d in deps[i]:
            if 0 <= d < len(deps):
                if state[d] == 1:
                    return stack[stack.index(d) :] + [d]
                if state[d] == 0 and (found := visit(d)):
                    return found
        stack.pop()
        state[i] = 2
        return None

    for i in range(len(deps)):
        if state[i] == 0 and (found := visit(i)):
            return found
    return None


class TaskFileError(ValueError):
    """A task file that cannot be read; the message names the file, the task id and the field."""


class TaskSelectionError(ValueError):
    """A split or limit that selects no task (or a negative limit): never silently run everything."""


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model that holds the last key of a validation-error location (for 'known keys' hints)."""
    model: type[BaseModel] | None = Task
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        f = model.model_fields.get(part)
        model = None
        todo = [f.annotation] if f is not None else []
        while todo:
            ann = todo.pop()
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
                break
            todo.extend(typing.get_args(ann))
    return model


def _describe(err: ValidationError) -> str:
    """'<field>: <what is wrong>' for the first error (pydantic's location, our validators' own field names)."""
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")  # a misspelt key explains the rest
    first = errors[0]
    loc = tuple(first["loc"])
    msg = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        model = _model_at(loc)
        known = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        msg = "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")
        if known:
            msg += f"; known keys: {', '.join(known)}"
    elif first["type"] == "value_error" and ":" in msg and (not loc or msg.startswith(str(loc[-1]))):
        field, _, msg = msg.partition(": ")
        loc = tuple(field.split("."))
    where = ".".join(str(p) for p in loc) or "(root)"
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return f"{where}: {msg}{more}"


def task_error(path: str | Path, pos: str, task_id: Any, err: ValidationError) -> TaskFileError:
    """The one message shape for a bad task: '<file>: <position>: task id <id>: field <field>: <what>'."""
    return TaskFileError(f"{path}: {pos}: task id {task_id!r}: field {_describe(err)}")


MAX_TASK_DEPTH = 32  # a task nests about 5 levels (task -> assets -> annotations -> entry -> span)


@dataclasses.dataclass(frozen=True)
class TaskLimits:
    """Size limits of what a task source reads (the `tasks:` keys of the same names; docs/world.md, "Task files").
    The defaults are far above every real file here (OmniGAIA's longest question is 1,867 characters, an embedded
    world task line 9 KB, a world corpus document 531 characters)."""

    max_file_bytes: int = 256 * 2**20  # a task file, benchmark file or corpus file; refused before it is read
    max_record_bytes: int = 8 * 2**20  # one JSONL line (a task with its tracks and documents, or one document)
    max_question_chars: int = 16_000  # a task's question (it is in every prompt and trajectory line of the task)
    max_document_chars: int = 100_000  # title + text of one corpus or task document (a search result's snippet)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"tasks.{f.name} must be a positive integer, got {v!r}")


TASK_LIMIT_KEYS = tuple(f.name for f in dataclasses.fields(TaskLimits))


def _too_long(n: int, key: str, limits: TaskLimits, unit: str) -> str:
    return (
        f"{n:,} {unit}, more than tasks.{key}={getattr(limits, key):,}; "
        f"raise tasks.{key} in the task source config if this is intended"
    )


def check_task_sizes(task: Task, path: str | Path, pos: str, limits: TaskLimits) -> None:
    """The length limits of one loaded task (question, its documents), as TaskFileError naming file, task, field."""
    where = f"{path}: {pos}: task id {task.id!r}: field"
    if len(task.question) > limits.max_question_chars:
        raise TaskFileError(
            f"{where} question: {_too_long(len(task.question), 'max_question_chars', limits, 'characters')}"
        )
    for i, doc in enumerate(task.documents):
        n = len(doc.title) + len(doc.text)
        if n > limits.max_document_chars:
            too_long = _too_long(n, "max_document_chars", limits, "characters")
            raise TaskFileError(f"{where} documents.{i}.text: {too_long} (title + text)")


def _open_bounded(path: Path, limits: TaskLimits, what: str):
    """The file opened for binary reading after its size was checked against max_file_bytes."""
    try:
        f = path.open("rb")
    except OSError as e:
        raise TaskFileError(f"{path}: cannot read {what}: {e}") from None
    size = os.fstat(f.fileno()).st_size
    if size > limits.max_file_bytes:
        f.close()
        raise TaskFileError(f"{path}: {what} of {_too_long(size, 'max_file_bytes', limits, 'bytes')}")
    return f


def read_bounded(path: str | Path, limits: TaskLimits, what: str) -> str:
    """A whole file (JSON list / benchmark metadata) as text: at most max_file_bytes are read; not UTF-8 names the
    line and column."""
    path = Path(path)
    with _open_bounded(path, limits, what) as f:
        data = f.read(limits.max_file_bytes + 1)
    if len(data) > limits.max_file_bytes:  # grew since the check, or a special file
        raise TaskFileError(f"{path}: {what} longer than tasks.max_file_bytes={limits.max_file_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise TaskFileError(
            f"{path}: line {line}, byte {col}: not UTF-8 text ({e.reason}); save the file as UTF-8"
        ) from None


def _bounded_lines(f, path: Path, limits: TaskLimits, what: str):
    """(line number, text) of each line of an open file, read one line at a time: a line over max_record_bytes is
    refused after reading max_record_bytes + 1 bytes of it, and the file once more than max_file_bytes were read."""
    total, ln, cap = 0, 0, limits.max_record_bytes
    while raw := f.readline(cap + 1):
        ln += 1
        total += len(raw)
        if total > limits.max_file_bytes:
            raise TaskFileError(f"{path}: {what} longer than tasks.max_file_bytes={limits.max_file_bytes:,} bytes")
        if len(raw.rstrip(b"\r\n")) > cap or (len(raw) > cap and not raw.endswith(b"\n")):
            raise TaskFileError(
                f"{path}: line {ln}: longer than tasks.max_record_bytes={cap:,} bytes (one task or document per "
                f"line); raise tasks.max_record_bytes in the task source config if this is intended"
            )
        try:
            yield ln, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskFileError(
                f"{path}: line {ln}, byte {e.start + 1}: not UTF-8 text ({e.reason}); save the file as UTF-8"
            ) from None


def _first_char(f) -> str:
    """The first non-whitespace character of an open file (the file position is restored)."""
    pos = f.tell()
    while chunk := f.read(4096):
        stripped = chunk.lstrip()
        if stripped:
            f.seek(pos)
            return stripped[:1].decode("ascii", errors="replace")
    f.seek(pos)
    return ""


def load_tasks(path: str | Path, limits: TaskLimits | None = None) -> list[Task]:
    """Read tasks from a JSON list or a JSONL file (one task object per line), within `limits` (TaskLimits())."""
    path, limits = Path(path), limits or TaskLimits()
    records: list[tuple[str, Any]] = []  # (position, record)
    with _open_bounded(path, limits, "task file") as f:
        first = _first_char(f)
        if first == "[":
            text = read_bounded(path, limits, "task file")
            if json_depth(text) > MAX_TASK_DEPTH:
                raise TaskFileError(f"{path}: JSON nested deeper than {MAX_TASK_DEPTH} levels; not a task file")
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise TaskFileError(f"{path}: not valid JSON at line {e.lineno}: {e.msg}") from None
            records = [(f"item {i}", r) for i, r in enumerate(data)]
        else:
            for ln, line in _bounded_lines(f, path, limits, "task file"):
                if not line.strip():
                    continue
                if json_depth(line) > MAX_TASK_DEPTH:
                    raise TaskFileError(f"{path}: line {ln}: JSON nested deeper than {MAX_TASK_DEPTH} levels")
                try:
                    records.append((f"line {ln}", json.loads(line)))
                except json.JSONDecodeError as e:
                    if first == "{" and ln == 1 and _is_one_json_object(read_bounded(path, limits, "task file")):
                        # a pretty-printed object (e.g. {"tasks": [...]}), not a first line that is not valid JSON
                        raise TaskFileError(
                            f"{path}: expected a list of tasks (a JSON list, or JSONL with one task object per "
                            "line), got a single JSON object"
                        ) from None
                    raise TaskFileError(f"{path}: line {ln} is not valid JSON: {e.msg}") from None
    tasks: list[Task] = []
    seen: dict[str, tuple[str, str]] = {}  # casefolded id -> (id, position)
    for pos, rec in records:
        if not isinstance(rec, dict):
            raise TaskFileError(
                f"{path}: {pos}: task id ?: field (root): expected an object, got {type(rec).__name__}"
            )
        tid = rec.get("id", "?")
        try:
            task = Task.model_validate(rec)
        except ValidationError as e:
            raise task_error(path, pos, tid, e) from None
        check_task_sizes(task, path, pos, limits)
        key = task.id.casefold()
        if key in seen:
            twin_id, twin_pos = seen[key]
            what = (
                "duplicate task id"
                if twin_id == task.id
                else f"differs from task id {twin_id!r} ({twin_pos}) only by case"
            )
            raise TaskFileError(f"{path}: {pos}: task id {task.id!r}: field id: {what}")
        seen[key] = (task.id, pos)
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}: contains no tasks")
    return tasks


def sidecar_corpus(task_path: str | Path) -> Path:
    """The corpus convention of a task file: `<dir>/<stem>.corpus.jsonl` next to it (`tasks.json` ->
    `tasks.corpus.jsonl`); used when the task source names no `corpus` and the file exists."""
    p = Path(task_path)
    return p.with_name(f"{p.stem}.corpus.jsonl")


def load_corpus(path: str | Path, limits: TaskLimits | None = None) -> list[dict]:
    """Read a corpus JSONL (one document object per line, blank lines skipped) into plain dicts
    {id, url, title, text, date}. Strict like task files: an unknown key, a missing url/text, a bad line, bytes that
    are not UTF-8 or a document over `limits.max_document_chars` raise TaskFileError naming the file, the line and the
    field. Ids default to `<file stem>-<line>`; an id used twice is an error. Read one line at a time (TaskLimits)."""
    path, limits = Path(path), limits or TaskLimits()
    with _open_bounded(path, limits, "corpus file") as f:
        return _corpus_docs(path, _bounded_lines(f, path, limits, "corpus file"), limits)


def _corpus_docs(path: Path, lines, limits: TaskLimits) -> list[dict]:
    docs: list[dict] = []
    seen: set[str] = set()
    for ln, line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path}: line {ln} is not valid JSON: {e.msg}") from None
        if not isinstance(rec, dict):
            raise TaskFileError(f"{path}: line {ln}: expected a document object, got {type(rec).__name__}")
        try:
            doc = Document.model_validate(rec)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "(root)"
            msg = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"])
            known = ", ".join(Document.model_fields)
            raise TaskFileError(
                f"{path}: line {ln}: document {rec.get('id', '?')!r}: field {where}: {msg} (document keys: {known})"
            ) from None
        d = doc.model_dump()
        d["id"] = d["id"] or f"{path.stem}-{ln}"
        if (n := len(doc.title) + len(doc.text)) > limits.max_document_chars:
            too_long = _too_long(n, "max_document_chars", limits, "characters")
            raise TaskFileError(f"{path}: line {ln}: document {d['id']!r}: field text: {too_long} (title + text)")
        if d["id"] in seen:
            raise TaskFileError(f"{path}: line {ln}: document {d['id']!r}: field id: duplicate document id")
        seen.add(d["id"])
        docs.append(d)
    if not docs:
        raise TaskFileError(f"{path}: corpus contains no documents")
    return docs


def _is_one_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def select_tasks(tasks: list[Task], split: str | None, limit: int | None, source_name: str) -> list[Task]:
    """The tasks of one split (None or "all": every task), then the first `limit` of them (None: no limit).

    An unknown split, a negative or zero limit, or a split that selects nothing raises TaskSelectionError naming the
    source and the splits it does have: a selection is never silently widened to "run everything".
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise TaskSelectionError(f"limit must be a positive integer (or unset for no limit), got {limit!r}")
    items = list(tasks)
    if split not in (None, "all"):
        if split not in SPLITS:
            raise TaskSelectionError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)} or all")
        items = [t for t in items if t.split == split]
    if not items:
        counts: dict[str, int] = {}
        for t in tasks:
            counts[t.split] = counts.get(t.split, 0) + 1
        have = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no tasks at all"
        raise TaskSelectionError(
            f"split {split!r} selects no tasks from {source_name} (its splits: {have}); choose another split or 'all'"
        )
    return items if limit is None else items[:limit]


def save_tasks(tasks: list[Task], path: str | Path) -> None:
    """Write tasks as JSONL (or a JSON list when the path ends in .json)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        text = jsonio.dumps([t.model_dump() for t in tasks], what=str(path), ensure_ascii=False, indent=1)
        path.write_text(text, encoding="utf-8")
    else:
        with path.open("w", encoding="utf-8") as f:
            for t in tasks:
                f.write(jsonio.dumps(t.model_dump(), what=f"{path}: task {t.id}", ensure_ascii=False) + "\n")
