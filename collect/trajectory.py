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
    """One record as its JSONL line (UTF-8, trailing newline); the bytes `TrajectoryWriter.append` writes."""
    text = json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n"
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate slipped past the boundary: write valid UTF-8 all the same
        return (json.dumps(scrub_record(record), ensure_ascii=False, sort_keys=False) + "\n").encode()


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


def iter_trajectories(path: str | Path, skipped: list | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, record) of every complete record. The one torn-line policy of every reader (resume, harvest,
    summaries): a broken line (a torn write, mid-file after a crash and a resume, or at the tail) or a line that is not
    a trajectory record is skipped with a warning naming the file and line, and appended to `skipped`."""
    p = Path(path)
    if not p.exists():
        return
    with open(p, "rb") as f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
                warnings.warn(f"{p}:{i}: skipping a broken trajectory line ({e})", stacklevel=2)
                if skipped is not None:
                    skipped.append(i)
                continue
            if not isinstance(rec, dict) or "task_id" not in rec:
                warnings.warn(f"{p}:{i}: skipping a line that is not a trajectory record", stacklevel=2)
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
