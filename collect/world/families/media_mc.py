"""Family `media_mc`: who announces X (subtitle / audio) -> what they hold (frames/clips) -> option letter (no web)."""

from __future__ import annotations

from collect.ledger import ALL_TOOLS
from collect.tasks import GoldNeed
from collect.world.entities import Entity, Gen
from collect.world.media import video_asset
from collect.world.vocab import EVENTS, KINDS, OBJECTS

NO_WEB_TOOLS = [t for t in ALL_TOOLS if t != "web_search"]


def build(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    v = video_asset(g, "video_1", e.kind, decoys)
    people = [g.person() for _ in range(4)]
    objs = rng.sample(OBJECTS, 4)
    event = rng.choice(EVENTS)
    src = rng.choice(["subtitle", "audio"])
    vis = rng.choice(["visual", "visual", "clip"])
    t0 = float(rng.randrange(20, int(v["duration"]) - 60, 5))
    v["tracks"]["subtitles"] = [s for s in v["tracks"]["subtitles"] if not (t0 - 4 <= s["start"] <= t0 + 40)]
    line = f"{people[0]}: Quick announcement about the {event}, everyone, please listen carefully."
    if src == "subtitle":
        v["tracks"]["subtitles"].append({"start": t0, "end": t0 + 5, "text": line})
    else:
        v["tracks"]["audio"].append({"start": t0, "end": t0 + 5, "kind": "speech", "text": line})
    v["tracks"]["subtitles"].append(
        {
            "start": t0 + 12,
            "end": t0 + 16,
            "text": f"{people[1]}: I will wait by {KINDS[e.kind]['scene']} until it is sorted.",
        }
    )
    for j, (p, o) in enumerate(zip(people, objs, strict=True)):
        tt = t0 + 8 + 7 * j
        if vis == "visual":
            v["tracks"]["frames"].append(
                {"t": tt, "description": f"{p} stands near the entrance holding {o}.", "ocr": ""}
            )
        else:
            v["tracks"]["clips"].append(
                {"start": tt, "end": tt + 6, "caption": f"{p} walks past the camera carrying {o}."}
            )
    opts = objs[:]
    rng.shuffle(opts)
    letters = "ABCD"
    options = [f"{letters[i]}. {o}" for i, o in enumerate(opts)]
    gold_letter = letters[opts.index(objs[0])]
    q = (
        f"In {v['id']}, someone makes an announcement about the {event}. What is the person who made that "
        f"announcement holding when they appear on screen?"
    )
    chain = [
        GoldNeed(
            need=f"identify who announces the {event}",
            need_role="anchor",
            preferred_source=src,
            query_focus=f"announcement about the {event}",
            gold_value=people[0],
        ),
        GoldNeed(
            need="which option the announcer is holding",
            need_role="applicability",
            preferred_source="visual",
            depends_on=[0],
            query_focus="holding carrying",
            gold_value=objs[0],
        ),
    ]
    return dict(
        question=q,
        answer=gold_letter,
        answer_type="multiple_choice",
        options=options,
        difficulty="Easy" if src == "subtitle" else "Medium",
        assets=[v],
        gold_chain=chain,
        allowed_tools=NO_WEB_TOOLS,
        meta={"gold_option_text": objs[0]},
    )
