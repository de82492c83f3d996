"""Family `anchor_web`: anchor (subtitle / visual / audio) -> one web fact about the entity."""

from __future__ import annotations

from collect.tasks import GoldNeed
from collect.world.corpus import entity_docs
from collect.world.entities import Entity, Gen
from collect.world.media import anchor_need, video_asset
from collect.world.vocab import ATTR_TYPES, KINDS, attr_focus, attr_question


def build(g: Gen, e: Entity, decoys: list[str]):
    src = g.rng.choice(["subtitle", "visual", "audio"])
    diff = "Easy" if src == "subtitle" else "Medium"
    v = video_asset(g, "video_1", e.kind, decoys)
    n0, phrase = anchor_need(g, e, v, src, timed=g.rng.random() < 0.5)
    attr = g.rng.choice(["founded_year", "milestone_year", "leader", "place", "opened_date", "price", "count"])
    alts = entity_docs(g, e, [attr])
    q = f"{phrase.capitalize()}. {attr_question(e.kind, attr)}?"
    chain = [
        n0,
        GoldNeed(
            need=f"{attr_focus(e.kind, attr)} of the {KINDS[e.kind]['noun']}",
            need_role="external_fact",
            preferred_source="web",
            depends_on=[0],
            query_focus=attr_focus(e.kind, attr),
            gold_value=e.attrs[attr],
        ),
    ]
    atype = {"year": "number", "date": "date", "int": "number"}.get(ATTR_TYPES[attr], "open")
    return dict(
        question=q,
        answer=e.attrs[attr],
        answer_type=atype,
        difficulty=diff,
        assets=[v],
        gold_chain=chain,
        meta={"alt_values": {"1": [{"value": x, "kind": "outdated"} for x in alts.get(attr, [])]}},
    )
