"""The six task families of the embedded world, one module each.

Every module exposes `build(g, e, decoys) -> dict`: the task fields (question, answer, answer_type, difficulty,
assets as plain dicts, gold_chain, optional options / allowed_tools / meta) for entity `e`, drawing only from `g.rng`.
`FAMILIES` fixes the order in which task i picks its family (`FAMILIES[(i // 5) % 6]`).
"""

from __future__ import annotations

from collections.abc import Callable

from collect.world.entities import Entity, Gen
from collect.world.families import anchor_compute, anchor_web, conflict, media_mc, multi_asset, unanswerable

FamilyBuilder = Callable[[Gen, Entity, list[str]], dict]

FAMILY_FUNCS: dict[str, FamilyBuilder] = {
    "anchor_web": anchor_web.build,
    "anchor_compute": anchor_compute.build,
    "media_mc": media_mc.build,
    "conflict": conflict.build,
    "unanswerable": unanswerable.build,
    "multi_asset": multi_asset.build,
}
FAMILIES = tuple(FAMILY_FUNCS)

__all__ = ["FAMILIES", "FAMILY_FUNCS", "FamilyBuilder"]
