"""Family `multi_asset`: poster image + radio advert audio (optionally -> exchange rate -> compute), or two videos."""

from __future__ import annotations

from collect.compute import evaluate
from collect.ledger import ALL_TOOLS
from collect.tasks import GoldNeed
from collect.world.entities import Entity, Gen, attr_sentence
from collect.world.media import anchor_need, new_tracks, video_asset
from collect.world.vocab import CURRENCIES, KINDS, a_an


def build(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    k = KINDS[e.kind]
    others = [g.make_entity(e.kind, -1) for _ in range(3)]
    if rng.random() < 0.5:  # image (sign) + audio (radio advert with several prices)
        img = dict(
            id="image_1",
            type="image",
            path="embedded/image_1.jpg",
            tracks=new_tracks(
                frames=[
                    {
                        "t": 0.0,
                        "description": f"A poster at {k['scene']} advertising {a_an(k['noun'])}.",
                        "ocr": e.name.upper(),
                    }
                ]
            ),
        )
        dur = 60.0
        aud = dict(id="audio_1", type="audio", duration=dur, path="embedded/audio_1.wav", tracks=new_tracks())
        ents = [e] + others
        rng.shuffle(ents)
        for j, x in enumerate(ents):
            aud["tracks"]["audio"].append(
                {
                    "start": 5.0 + 12 * j,
                    "end": 14.0 + 12 * j,
                    "kind": "speech",
                    "text": f"Radio advert: {attr_sentence(x, 'price')}",
                }
            )
        aud["tracks"]["audio"].append(
            {"start": 52.0, "end": 58.0, "kind": "music", "text": "Jingle with bright synths."}
        )
        chain = [
            GoldNeed(
                need=f"identify the {k['noun']} on the poster in image_1",
                need_role="anchor",
                preferred_source="visual",
                query_focus=f"name of the {k['noun']} on the poster",
                gold_value=e.name,
            ),
            GoldNeed(
                need=f"price of {k['price']} as stated in audio_1",
                need_role="external_fact",
                preferred_source="audio",
                depends_on=[0],
                query_focus=f"price of {k['price']}",
                gold_value=e.attrs["price"],
            ),
        ]
        q = (
            f"image_1 shows a poster for {a_an(k['noun'])}. According to the radio advert in audio_1, what is the "
            f"price of {k['price']} from that {k['noun']}?"
        )
        answer, diff, assets = e.attrs["price"], "Medium", [img, aud]
        if rng.random() < 0.5:
            cur = next(c for c in CURRENCIES if c[1] in e.attrs["price"])
            chain.append(
                GoldNeed(
                    need=f"current exchange rate of the {cur[0]} to the euro",
                    need_role="external_fact",
                    preferred_source="web",
                    depends_on=[1],
                    query_focus="to euro exchange rate",
                    gold_value=cur[2],
                )
            )
            expr = "round(to_num(v1) * to_num(v2), 2)"
            answer = evaluate(expr, {1: e.attrs["price"], 2: cur[2]})
            chain.append(
                GoldNeed(
                    need="convert the price to euros",
                    need_role="compute",
                    preferred_source="computation",
                    depends_on=[1, 2],
                    query_focus=f"compute: {expr}",
                    gold_value=answer,
                )
            )
            q = q[:-1] + ", in euros at the current reference exchange rate (two decimals)?"
            diff = "Hard"
        atype = "number" if diff == "Hard" else "open"
    else:  # two videos: the first names the entity, the second shows a noticeboard of leaders
        v1 = video_asset(g, "video_1", e.kind, decoys)
        n0, phrase = anchor_need(g, e, v1, "subtitle", timed=True)
        v2 = video_asset(g, "video_2", e.kind, [], dur=60.0)
        ents = [e] + others
        rng.shuffle(ents)
        for j, x in enumerate(ents):
            v2["tracks"]["frames"].append(
                {
                    "t": 10.0 + 10 * j,
                    "description": "A noticeboard row listing a name and a title.",
                    "ocr": f"{x.name.upper()} - {k['leader'].upper()}: {x.attrs['leader']}",
                }
            )
        n0 = n0.model_copy(update={"need": f"identify the {k['noun']} named in video_1"})
        chain = [
            n0,
            GoldNeed(
                need=f"{k['leader']} listed on the noticeboard in video_2",
                need_role="external_fact",
                preferred_source="visual",
                depends_on=[0],
                query_focus=f"noticeboard {k['leader']}",
                gold_value=e.attrs["leader"],
            ),
        ]
        q = (
            f"{phrase.capitalize()}. video_2 shows a noticeboard listing the {k['leader']} of several "
            f"{k['noun']}s. Who is the {k['leader']} of the {k['noun']} from video_1?"
        )
        answer, diff, assets, atype = e.attrs["leader"], rng.choice(["Medium", "Hard"]), [v1, v2], "open"
    return dict(
        question=q,
        answer=answer,
        answer_type=atype,
        difficulty=diff,
        assets=assets,
        gold_chain=chain,
        allowed_tools=list(ALL_TOOLS),
    )
