"""Benchmark loaders: OmniGAIA and WorldSense files -> collect.tasks.Task.

Real benchmark tasks carry no gold chain (the need parser must work from the question). Missing optional fields never
crash a load; media that cannot be found is listed per task in task.meta["missing_media"] and summarised in one
logged warning. Every task built here passes the strict schema of collect.tasks: a bad item (e.g. a WorldSense answer
that is not one of the candidate letters) raises TaskFileError naming the file, the task and the field. Files are
read within collect.tasks.TaskLimits (file size, question length); a subtitle file entry that ends before it starts
is refused naming the subtitle file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from functools import cache
from pathlib import Path

from pydantic import ValidationError

from collect.ledger import ALL_TOOLS
from collect.tasks import (
    AssetSpec,
    Task,
    TaskFileError,
    TaskLimits,
    check_task_sizes,
    read_bounded,
    task_error,
)

log = logging.getLogger(__name__)
LEVELS = ("Easy", "Medium", "Hard")
MEDIA_TYPES = ("video", "audio", "image")
NO_WEB_TOOLS = [t for t in ALL_TOOLS if t != "web_search"]
# The declared train/test split of OmniGAIA's 360 tasks (shipped in the repository; docs/world.md "Train and
# evaluation splits"): harvest writes training rows only from train-split tasks.
OMNIGAIA_SPLITS = Path(__file__).resolve().parents[1] / "data" / "omnigaia" / "splits.json"
WORLDSENSE_TRAIN_SHARE = 5  # one video in five (by a hash of its id) is a train video: worldsense_split


@cache
def omnigaia_splits(path: str | Path = OMNIGAIA_SPLITS) -> dict[str, str]:
    """task id ("omnigaia-<id>") -> "train" | "test", from the shipped split file."""
    data = _read_json(path, TaskLimits(), "split file")
    return {tid: split for split in ("train", "test") for tid in data.get(split) or []}


def worldsense_split(video_id: str) -> str:
    """A WorldSense video's split, the same for all its questions: "train" when sha256("worldsense-split:<video id>")
    is 0 mod WORLDSENSE_TRAIN_SHARE (about a fifth of the 1,662 videos), else "test". The paper trains on WorldSense
    teacher runs without publishing which; this rule is deterministic and keeps a video's questions together."""
    h = int.from_bytes(hashlib.sha256(f"worldsense-split:{video_id}".encode()).digest()[:8], "big")
    return "train" if h % WORLDSENSE_TRAIN_SHARE == 0 else "test"


def _read_json(path: str | Path, limits: TaskLimits, what: str = "benchmark file"):
    path = Path(path)
    text = read_bounded(path, limits, what)  # size limit; not UTF-8 names line and byte
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskFileError(f"{path}: not valid JSON at line {e.lineno}: {e.msg}") from None
    except RecursionError:
        raise TaskFileError(f"{path}: JSON nested too deeply; not a {what}") from None


def _answer_type(answer: str) -> str:
    return "number" if re.fullmatch(r"\s*-?[\d,]*\.?\d+\s*%?\s*", answer or "") else "open"


def load_omnigaia(
    metadata_path: str | Path, media_root: str | Path | None = None, limits: TaskLimits | None = None
) -> list[Task]:
    """Load OmniGAIA's test_metadata.json (a list of items). Asset paths are relative to media_root
    (`data_media_test/`); without a media root every asset is reported missing."""
    limits = limits or TaskLimits()
    data = _read_json(metadata_path, limits)
    if not isinstance(data, list):
        raise TaskFileError(f"{metadata_path}: expected a JSON list of items, got {type(data).__name__}")
    tasks: list[Task] = []
    n_missing_tasks = n_missing_files = 0
    splits = omnigaia_splits()
    for pos, item in enumerate(data):
        if not isinstance(item, dict):
            raise TaskFileError(f"{metadata_path}: item {pos}: task id ?: field (root): expected an object")
        raw_id = item.get("id", pos)
        tid = f"omnigaia-{raw_id}"
        question, answer = item.get("question"), item.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise TaskFileError(f"{metadata_path}: item {pos}: task id {raw_id!r}: field question: missing or empty")
        answer = "" if answer is None else str(answer)
        level = item.get("Level") if item.get("Level") in LEVELS else "Medium"
        assets: list[AssetSpec] = []
        spans: dict[str, list[float]] = {}
        missing: list[str] = []
        skipped: list[str] = []
        for j, m in enumerate(item.get("omni_modal_input") or []):
            if not isinstance(m, dict) or m.get("type") not in MEDIA_TYPES:
                skipped.append(str(m)[:80])
                continue
            rel = m.get("path")
            aid = str(m.get("id") or (Path(rel).stem if rel else f"{m['type']}_{j}"))
            while any(a.id == aid for a in assets):
                aid = f"{aid}_{j}"
            path = None
            if rel:
                path = str(Path(media_root) / rel) if media_root is not None else rel
                if media_root is None or not os.path.exists(path):
                    missing.append(rel)
            else:
                missing.append(f"{aid} (no path)")
            assets.append(AssetSpec(id=aid, type=m["type"], path=path))
            span = m.get("time_span") or ([m["t_start"], m["t_end"]] if "t_start" in m and "t_end" in m else None)
            if span is not None:
                spans[aid] = [float(x) for x in span]
        if missing:
            n_missing_tasks += 1
            n_missing_files += len(missing)
        meta = {
            "level": item.get("Level"),
            "task_type": item.get("task_type"),
            "annotated_solution": item.get("annotated_solution") or [],
            "sources": item.get("sources") or [],
            "total_steps": item.get("total_steps"),
            "required_external_tools": item.get("required_external_tools") or [],
            "missing_media": missing,
        }
        if spans:
            meta["time_spans"] = spans
        if skipped:
            meta["skipped_inputs"] = skipped
        try:
            task = Task(
                id=tid,
                question=question,
                answer=answer,
                answer_type=_answer_type(answer),
                difficulty=level,
                category=str(item.get("category") or ""),
                family=str(item.get("task_type") or ""),
                split=splits.get(tid, "test"),  # a task the split file does not list is never trained on
                assets=assets,
                source="omnigaia",
                meta=meta,
            )
        except ValidationError as e:
            raise task_error(metadata_path, f"item {pos}", raw_id, e) from None
        check_task_sizes(task, metadata_path, f"item {pos}", limits)
        tasks.append(task)
    if n_missing_tasks:
        log.warning(
            "OmniGAIA %s: %d of %d tasks have missing media (%d files; media_root=%s)",
            metadata_path,
            n_missing_tasks,
            len(tasks),
            n_missing_files,
            media_root,
        )
    return tasks


def parse_srt(text: str) -> list[dict]:
    """Minimal SRT reader -> [{start, end, text}]."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip()):
        lines = [x for x in block.strip().splitlines() if x.strip()]
        for k, line in enumerate(lines):
            m = re.match(r"(\d+):(\d+):(\d+)[,.](\d+)\s*-->\s*(\d+):(\d+):(\d+)[,.](\d+)", line)
            if m:
                g = [int(x) for x in m.groups()]
                start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
                end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
                out.append({"start": start, "end": end, "text": " ".join(lines[k + 1 :])})
                break
    return out


def _subtitles(subtitles_root: str | Path | None, vid: str, limits: TaskLimits) -> list[dict]:
    """The subtitles of one video from `<vid>.srt` or `<vid>.json`; an entry that is malformed or ends before it
    starts raises TaskFileError naming the subtitle file, the entry and the video (all its tasks share it)."""
    if subtitles_root is None:
        return []
    root = Path(subtitles_root)
    srt, js = root / f"{vid}.srt", root / f"{vid}.json"
    if srt.exists():
        path, subs = srt, parse_srt(srt.read_text(encoding="utf-8", errors="replace"))
    elif js.exists():
        path, data = js, _read_json(js, limits, "subtitle file")
        if not isinstance(data, list):
            raise TaskFileError(f"{js}: video {vid!r}: expected a list of {{start, end, text}} subtitles")
        subs = []
        for k, x in enumerate(data):
            try:
                subs.append({"start": float(x["start"]), "end": float(x["end"]), "text": str(x["text"])})
            except (KeyError, TypeError, ValueError) as e:
                raise TaskFileError(
                    f"{js}: subtitle {k}: video {vid!r}: expected {{start, end, text}} with numeric times ({e!r})"
                ) from None
    else:
        return []
    for k, sub in enumerate(subs):
        if not sub["end"] >= sub["start"]:
            raise TaskFileError(
                f"{path}: subtitle {k}: video {vid!r} (tasks worldsense-{vid}-task*): field end: the subtitle ends "
                f"at {sub['end']:g} s, before it starts ({sub['start']:g} s)"
            )
    return subs


def load_worldsense(
    qa_json_path: str | Path,
    video_root: str | Path | None = None,
    subtitles_root: str | Path | None = None,
    limits: TaskLimits | None = None,
) -> list[Task]:
    """Load worldsense_qa.json (dict keyed by video id, with task0, task1, ... per video). Web search is disabled
    via allowed_tools, as in the benchmark's protocol."""
    limits = limits or TaskLimits()
    data = _read_json(qa_json_path, limits)
    if not isinstance(data, dict):
        raise TaskFileError(f"{qa_json_path}: expected an object keyed by video id, got {type(data).__name__}")
    tasks: list[Task] = []
    n_missing = 0
    for vid, entry in data.items():
        if not isinstance(entry, dict):
            raise TaskFileError(f"{qa_json_path}: video {vid!r}: field (root): expected an object")
        rel = f"{vid}.mp4"
        path = str(Path(video_root) / rel) if video_root is not None else rel
        missing = [] if video_root is not None and os.path.exists(path) else [rel]
        duration = entry.get("duration")
        subs = _subtitles(subtitles_root, vid, limits)
        keys = sorted((k for k in entry if re.fullmatch(r"task\d+", k)), key=lambda k: int(k[4:]))
        for key in keys:
            t = entry[key]
            tid = f"worldsense-{vid}-{key}"
            for fld in ("question", "candidates", "answer"):
                if fld not in t:
                    raise TaskFileError(f"{qa_json_path}: task id {tid!r}: field {fld}: missing")
            cands = [str(c) for c in t["candidates"]]
            # validated inside Task below, so a bad duration or subtitle (NaN, Infinity) names the task and field
            asset = {
                "id": f"video_{vid}",
                "type": "video",
                "duration": duration,
                "path": path,
                "tracks": {"subtitles": subs},
            }
            if missing:
                n_missing += 1
            try:
                task = Task(
                    id=tid,
                    question=str(t["question"]),
                    answer=str(t["answer"]).strip().upper()[:1],
                    answer_type="multiple_choice",
                    options=cands,
                    difficulty="Medium",
                    category=str(entry.get("domain") or ""),
                    family=str(t.get("task_type") or ""),
                    split=worldsense_split(str(vid)),
                    assets=[asset],
                    allowed_tools=list(NO_WEB_TOOLS),
                    source="worldsense",
                    meta={
                        "sub_category": entry.get("sub_category"),
                        "audio_class": entry.get("audio_class") or [],
                        "video_caption": entry.get("video_caption"),
                        "task_domain": t.get("task_domain"),
                        "task_type": t.get("task_type"),
                        "missing_media": list(missing),
                        "prompt_suffix": "Respond with only the letter (A, B, C, or D).",
                    },
                )
            except ValidationError as e:
                raise task_error(qa_json_path, f"video {vid!r}", tid, e) from None
            check_task_sizes(task, qa_json_path, f"video {vid!r}", limits)
            tasks.append(task)
    if n_missing:
        log.warning(
            "WorldSense %s: %d of %d tasks have missing media (video_root=%s)",
            qa_json_path,
            n_missing,
            len(tasks),
            video_root,
        )
    return tasks
