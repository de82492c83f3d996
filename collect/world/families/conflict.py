"""Family `conflict`: anchor -> web fact contradicted by a forum post; the video itself resolves the conflict."""

from __future__ import annotations

from collect.tasks import GoldNeed
from collect.world.corpus import entity_docs
from collect.world.entities import Entity, Gen, attr_sentence
from collect.world.media import anchor_need, video_asset
from collect.world.vocab import ATTR_TYPES, CURRENCIES, KINDS, attr_focus, attr_question, slugify


def build(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    k = KINDS[e.kind]
    v = video_asset(g, "video_1", e.kind, decoys)
    n0, phrase = anchor_need(g, e, v, "subtitle", timed=True)
    attr = rng.choice(["founded_year", "milestone_year", "count", "leader", "length"])
    entity_docs(g, e, [attr], outdated=False)
    cur = next(c for c in CURRENCIES if c[1] in e.attrs["price"])
    wrong = g.value(ATTR_TYPES[attr], cur)
    while wrong == e.attrs[attr]:
        wrong = g.value(ATTR_TYPES[attr], cur)
    g.add_doc(
        f"{k['host']}-forum.example",
        slugify(e.name),
        f"Forum thread: facts about {e.name}",
        f"A regular poster on this travel forum insists on the following. {attr_sentence(e, attr, wrong)} "
        f"Several replies dispute the figure, but nobody cites a source.",
        2024,
    )
    # the media resolves the conflict: a plaque (frame), the guide (subtitle) or an announcement (audio)
    res = rng.choice(["subtitle", "visual", "audio"])
    t = float(v["duration"]) - 35.0
    text = attr_sentence(e, attr)
    if res == "subtitle":
        v["tracks"]["subtitles"].append({"start": t, "end": t + 5, "text": f"The guide confirms it: {text}"})
    elif res == "visual":
        v["tracks"]["frames"].append({"t": t, "description": "A bronze plaque with the official record.", "ocr": text})
    else:
        v["tracks"]["audio"].append({"start": t, "end": t + 5, "kind": "speech", "text": f"Tour recording: {text}"})
    noun = k["noun"]
    chain = [
        n0,
        GoldNeed(
            need=f"{attr_focus(e.kind, attr)} of the {noun}",
            need_role="external_fact",
            preferred_source="web",
            depends_on=[0],
            query_focus=attr_focus(e.kind, attr),
            gold_value=e.attrs[attr],
        ),
    ]
    q = (
        f"{phrase.capitalize()}. {attr_question(e.kind, attr)}? Web sources disagree; use the most reliable "
        f"evidence, including the video itself."
    )
    atype = {"year": "number", "int": "number"}.get(ATTR_TYPES[attr], "open")
    return dict(
        question=q,
        answer=e.attrs[attr],
        answer_type=atype,
        difficulty=rng.choice(["Medium", "Hard"]),
        assets=[v],
        gold_chain=chain,
        meta={"alt_values": {"1": [{"value": wrong, "kind": "conflicting"}]}, "resolver": res},
    )
