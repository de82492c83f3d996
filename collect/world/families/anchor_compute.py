"""Family `anchor_compute`: anchor -> two web facts (or a price and an exchange rate) -> a compute need."""

from __future__ import annotations

from collect.compute import evaluate
from collect.tasks import GoldNeed
from collect.world.corpus import entity_docs
from collect.world.entities import Entity, Gen
from collect.world.media import anchor_need, video_asset
from collect.world.vocab import CURRENCIES, KINDS, attr_focus

COMPUTE_KINDS = {
    "years": (
        ("founded_year", "milestone_year"),
        "to_num(v2) - to_num(v1)",
        "How many years passed between the year it {a} and the year it {b}?",
    ),
    "days": (
        ("opened_date", "date2"),
        "days_between(v1, v2)",
        "How many days passed between the day it {a} and the day it {b}?",
    ),
    "quantity": (
        ("count", "per_unit"),
        "to_num(v1) * to_num(v2)",
        "Multiplying the {a} by the {b}, what total do you get?",
    ),
    "units": (
        ("length", "ext"),
        "round((to_num(v1) + to_num(v2)) * 0.621371, 2)",
        "What is the combined length of {a} and {b}, in miles (1 km = 0.621371 miles), to two decimals?",
    ),
    "currency": (
        ("price",),
        "round(to_num(v1) * to_num(v2), 2)",
        "What is the price of {a} in euros, using the current reference exchange rate, to two decimals?",
    ),
}


def _compute_question(e: Entity, ck: str) -> str:
    k = KINDS[e.kind]
    attrs, _, tmpl = COMPUTE_KINDS[ck]
    words = {
        "founded_year": k["founded"],
        "milestone_year": k["milestone"],
        "opened_date": k["opened"],
        "date2": k["date2"],
        "count": f"number of {k['count']}",
        "per_unit": f"number of {k['per_unit']}",
        "length": k["length"],
        "ext": k["ext"],
        "price": k["price"],
    }
    return tmpl.format(a=words[attrs[0]], b=words[attrs[-1]])


def build(g: Gen, e: Entity, decoys: list[str]):
    ck = g.rng.choice(list(COMPUTE_KINDS))
    attrs, expr, _ = COMPUTE_KINDS[ck]
    src = g.rng.choice(["subtitle", "visual", "audio"])
    v = video_asset(g, "video_1", e.kind, decoys)
    n0, phrase = anchor_need(g, e, v, src, timed=True)
    alts = entity_docs(g, e, list(attrs))
    noun = KINDS[e.kind]["noun"]
    chain = [n0]
    values = {}
    for a in attrs:
        chain.append(
            GoldNeed(
                need=f"{attr_focus(e.kind, a)} of the {noun}",
                need_role="external_fact",
                preferred_source="web",
                depends_on=[0],
                query_focus=attr_focus(e.kind, a),
                gold_value=e.attrs[a],
            )
        )
        values[len(chain) - 1] = e.attrs[a]
    alt_meta = {str(i + 1): [{"value": x, "kind": "outdated"} for x in alts.get(a, [])] for i, a in enumerate(attrs)}
    if ck == "currency":
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
        values[2] = cur[2]
        alt_meta["2"] = [{"value": cur[3], "kind": "outdated"}]
        expr = "round(to_num(v1) * to_num(v2), 2)"
    deps = sorted(values)
    answer = evaluate(expr, values)
    chain.append(
        GoldNeed(
            need="compute the answer from the collected values",
            need_role="compute",
            preferred_source="computation",
            depends_on=deps,
            query_focus=f"compute: {expr}",
            gold_value=answer,
        )
    )
    q = f"{phrase.capitalize()}. {_compute_question(e, ck)}"
    diff = "Medium" if ck in ("years", "quantity") else "Hard"
    return dict(
        question=q,
        answer=answer,
        answer_type="number",
        difficulty=diff,
        assets=[v],
        gold_chain=chain,
        meta={"alt_values": alt_meta, "compute_kind": ck},
    )
