"""Deterministic generator of the embedded world: assembles tasks from the family builders.

Everything is drawn from one `random.Random(seed)` stream in a fixed order (the exchange-rate docs first, then per
task: entity, decoy names, family builder), so the same seed gives byte-identical JSON. Entity names are invented from
syllables (checked unique), so no model can answer from memory.

Modules: `vocab` (tables and phrase templates), `entities` (the `Gen` state: rng, names, values, corpus),
`corpus` (profile docs and distractors), `media` (annotation tracks and anchors), `families/` (one builder per
family).
"""

from __future__ import annotations

import random

from collect.tasks import AssetSpec, Task
from collect.world.corpus import currency_docs
from collect.world.entities import Gen
from collect.world.families import FAMILIES, FAMILY_FUNCS
from collect.world.media import sort_tracks
from collect.world.vocab import KINDS

__all__ = ["FAMILIES", "KINDS", "SPLIT_OF", "generate"]

SPLIT_OF = {0: "train", 1: "train", 2: "train", 3: "dev", 4: "test"}


def generate(seed: int, n_tasks: int) -> tuple[list[Task], list[dict]]:
    g = Gen(random.Random(seed))
    currency_docs(g)
    kinds = list(KINDS)
    tasks: list[Task] = []
    for i in range(n_tasks):
        family = FAMILIES[(i // 5) % len(FAMILIES)]
        kind = kinds[(i * 7 + i // 8) % len(kinds)]
        e = g.make_entity(kind, i)
        decoys = [g.entity_name(kind) for _ in range(2)]
        spec = FAMILY_FUNCS[family](g, e, decoys)
        spec["assets"] = [AssetSpec.model_validate({**a, "tracks": sort_tracks(a["tracks"])}) for a in spec["assets"]]
        tasks.append(
            Task(
                id=f"w{seed}-{i:04d}-{family}",
                family=family,
                category=KINDS[kind]["category"],
                split=SPLIT_OF[i % 5],
                source="embedded",
                meta={"entity": e.name, "kind": kind, **spec.pop("meta", {})},
                **spec,
            )
        )
    return tasks, g.corpus
