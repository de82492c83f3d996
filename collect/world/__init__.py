"""The embedded world: a generated, contamination-free benchmark of omni-modal evidence-seeking tasks.

`build_world(seed)` is deterministic (same seed -> byte-identical `World.to_json()`); `load_world(seed, cache_dir)`
builds it in about a second and optionally caches it as JSON. See docs/world.md for the families and the corpus.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from collect import jsonio
from collect.tasks import Task
from collect.world.generator import FAMILIES, KINDS, generate

WORLD_VERSION = 1
DEFAULT_N_TASKS = 360  # the default world: 216 train / 72 dev / 72 test tasks
SPLITS = ("train", "dev", "test")

__all__ = ["DEFAULT_N_TASKS", "FAMILIES", "KINDS", "SPLITS", "World", "build_world", "load_world"]


@dataclass
class World:
    seed: int
    tasks: list[Task]
    corpus: list[dict]  # {id, url, title, text, date}

    def split(self, name: str) -> list[Task]:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        return [t for t in self.tasks if t.split == name]

    def task(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise KeyError(f"no task {task_id!r} in world seed {self.seed}")

    def texts(self) -> Iterator[str]:
        """Every natural-language text of the world (questions, options, corpus docs, track texts): tokenizer food."""
        for t in self.tasks:
            yield t.question
            yield from t.options
            for a in t.assets:
                tr = a.tracks
                yield from (s.text for s in tr.subtitles)
                yield from (s.text for s in tr.audio)
                yield from (c.caption for c in tr.clips)
                yield from (f"{f.description} {f.ocr}".strip() for f in tr.frames)
        for d in self.corpus:
            yield f"{d['title']}\n{d['text']}"

    def to_dict(self) -> dict:
        return {
            "version": WORLD_VERSION,
            "seed": self.seed,
            "tasks": [t.model_dump() for t in self.tasks],
            "corpus": self.corpus,
        }

    def to_json(self) -> str:
        return jsonio.dumps(self.to_dict(), what="world", ensure_ascii=False, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> World:
        return cls(seed=d["seed"], tasks=[Task.model_validate(t) for t in d["tasks"]], corpus=d["corpus"])


def build_world(seed: int = 0, n_tasks: int = DEFAULT_N_TASKS) -> World:
    if n_tasks < 1:
        raise ValueError(f"n_tasks must be positive, got {n_tasks}")
    tasks, corpus = generate(seed, n_tasks)
    return World(seed=seed, tasks=tasks, corpus=corpus)


def load_world(seed: int = 0, cache_dir: str | Path | None = None, n_tasks: int = DEFAULT_N_TASKS) -> World:
    """Build the world, reading/writing a JSON cache under cache_dir when given (keyed by version, seed, size)."""
    if cache_dir is None:
        return build_world(seed, n_tasks)
    path = Path(cache_dir) / f"world_v{WORLD_VERSION}_seed{seed}_n{n_tasks}.json"
    if path.exists():
        return World.from_dict(json.loads(path.read_text(encoding="utf-8")))
    world = build_world(seed, n_tasks)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(world.to_json(), encoding="utf-8")
    tmp.replace(path)
    return world
