"""Trajectory files: one JSON line per finished task, appended atomically; reading tolerates a torn last line.

Writing: the whole line (JSON + "\\n") goes out in one `os.write` on an O_APPEND descriptor, then `os.fsync`. A crash
can only leave a last line without its newline (or with invalid JSON); `read_trajectories` skips such a line with a
warning and `repair_tail` truncates it before appending, so resume never glues a new record onto a broken one.
Format: docs/trajectory.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

from collect import jsonio
from collect.bounds import scrub_record


def config_hash(*parts) -> str:
    """Stable short hash of configs (dataclasses or JSON-able values); never includes keys (configs hold none)."""

    def plain(x):
        return dataclasses.asdict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else x

    blob = json.dumps([plain(p) for p in parts], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def repair_tail(path: str | Path) -> int:
    """Truncate a torn last line (no trailing newline). Returns the number of bytes removed."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return 0
    with open(p, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return 0
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return len(data) - keep


def encode_record(record: dict) -> bytes:
    """One record as its JSONL line (UTF-8, trailing newline); the bytes `TrajectoryWriter.append` writes. Strict
    JSON with the known secrets removed (collect.jsonio.dumps): a NaN or Infinity anywhere raises NotJSON naming the
    task and the field (model and task values are refused before they get here, so one that does is a bug)."""
    what = f"trajectory record of task {record.get('task_id')}" if isinstance(record, dict) else "trajectory record"
    text = jsonio.dumps(record, what=what, ensure_ascii=False, sort_keys=False) + "\n"
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate slipped past the boundary: write valid UTF-8 all the same
        return (jsonio.dumps(scrub_record(record), what=what, ensure_ascii=False, sort_keys=False) + "\n").encode()


class TrajectoryWriter:
    """Append finished task records to a JSONL file (one line each, atomic append + fsync)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        removed = repair_tail(self.path)
        if removed:
            warnings.warn(f"{self.path}: removed a torn last line ({removed} bytes) before appending", stacklevel=2)

    def append(self, record: dict) -> None:
        self.append_line(encode_record(record))

    def append_line(self, line: bytes) -> None:
        """Append one line made by `encode_record` (worker processes encode, the parent writes: collect/run.py)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            while written < len(line):  # os.write may be partial on some filesystems
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)


# Top-level fields the readers (resume, summaries, harvest) use, with the JSON type a record written by run_task holds.
_FIELD_TYPES = {
    "steps": list,
    "initial_events": list,
    "final_events": list,
    "usage": dict,
    "faults": dict,
    "final_ledger": dict,
    "task_meta": dict,
    "r0": dict,
}


def record_problem(rec) -> str | None:
    """Why a decoded line is not a trajectory record the readers can use, else None: not an object, no task_id or
    one that is not a non-empty string (a list would break every set of ids), or a field of the wrong type."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    tid = rec.get("task_id")
    if not isinstance(tid, str) or not tid:
        return f"task_id is {json.dumps(tid)[:80]}" if "task_id" in rec else "no task_id"
    for key, typ in _FIELD_TYPES.items():
        if key in rec and not isinstance(rec[key], typ):
            return f"task {tid[:80]!r}: field {key} is a {type(rec[key]).__name__}, not a {typ.__name__}"
    return None


def iter_trajectories(path: str | Path, skipped: list | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of every complete record. The one policy of every reader (resume, harvest, summaries)
    for lines it cannot trust: a broken line (a torn write, mid-file after a crash and a resume, or at the tail), one
    that is not strict JSON (NaN/Infinity, a number past what a float or Python's int-string limit holds, nesting
    past the recursion limit: collect.jsonio.loads), or one that is not a usable trajectory record (`record_problem`)
    is skipped with a warning naming the file and line, and appended to `skipped`. Its task is then not finished, so
    resume runs it again (the new record is appended; the old line stays and is skipped on every read)."""
    p = Path(path)
    if not p.exists():
        return
    with open(p, "rb") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = jsonio.loads(raw)
            except jsonio.BadJSON as e:
                warnings.warn(f"{p}:{i}: skipping a broken trajectory line ({e})", stacklevel=2)
                if skipped is not None:
                    skipped.append(i)
                continue
            problem = record_problem(rec)
            if problem is not None:
                warnings.warn(f"{p}:{i}: skipping a line that is not a trajectory record ({problem})", stacklevel=2)
                if skipped is not None:
                    skipped.append(i)
                continue
            yield i, rec


def read_trajectories(path: str | Path) -> list[dict]:
    """All complete records (see `iter_trajectories` for the torn-line policy)."""
    return [rec for _, rec in iter_trajectories(path)]


def finished_ids(path: str | Path) -> set[str]:
    """Task ids already written (for resume)."""
    return {r["task_id"] for r in read_trajectories(path)}
