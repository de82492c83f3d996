"""Family `unanswerable`: the web fact is missing for the entity, or the anchor window lies past the video's end."""

from __future__ import annotations

from collect.tasks import GoldNeed
from collect.world.corpus import entity_docs
from collect.world.entities import Entity, Gen
from collect.world.media import anchor_need, fmt_window, video_asset
from collect.world.vocab import KINDS, a_an, attr_focus, attr_question


def build(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    k = KINDS[e.kind]
    v = video_asset(g, "video_1", e.kind, decoys)
    attr = rng.choice(["founded_year", "leader", "count", "milestone_year"])
    if rng.random() < 0.6:  # the web fact does not exist for this entity (only for similar names)
        n0, phrase = anchor_need(g, e, v, rng.choice(["subtitle", "visual", "audio"]), timed=True)
        entity_docs(g, e, [attr], omit=(attr,), outdated=False)
        missing, diff = "web", "Medium"
        n1_gold = None
    else:  # the anchor is not in the media: the question points past the end of the video
        start = float(v["duration"]) + 30
        win = (start, start + 15)
        n0 = GoldNeed(
            need=f"identify the {k['noun']} named in {v['id']}",
            need_role="anchor",
            preferred_source="subtitle",
            query_focus=f"name of the {k['noun']} {fmt_window(win)}",
            gold_value=None,
        )
        phrase = f"{fmt_window(win)} of {v['id']}, the narrator names {a_an(k['noun'])}"
        entity_docs(g, e, [attr])
        missing, diff = "anchor", "Hard"
        n1_gold = e.attrs[attr]
    chain = [
        n0,
        GoldNeed(
            need=f"{attr_focus(e.kind, attr)} of the {k['noun']}",
            need_role="external_fact",
            preferred_source="web",
            depends_on=[0],
            query_focus=attr_focus(e.kind, attr),
            gold_value=n1_gold,
        ),
    ]
    q = (
        f"{phrase.capitalize()}. {attr_question(e.kind, attr)}? "
        "If the evidence cannot be found, answer 'insufficient'."
    )
    return dict(
        question=q,
        answer="insufficient",
        answer_type="unanswerable",
        difficulty=diff,
        assets=[v],
        gold_chain=chain,
        meta={"missing": missing},
    )
