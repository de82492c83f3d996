"""The web corpus: the gold profile and its distractors per needed attribute, and the shared exchange-rate docs."""

from __future__ import annotations

from collect.world.entities import Entity, Gen, attr_sentence
from collect.world.vocab import ATTR_TYPES, CURRENCIES, FILLER, KINDS, a_an, slugify


def entity_docs(
    g: Gen, e: Entity, needed: list[str], *, omit: tuple[str, ...] = (), outdated: bool = True
) -> dict[str, list[str]]:
    """Write the gold profile and >= 5 distractors per needed attribute. Returns alt values per attribute
    ({attr: [outdated values]}) that a privileged critic may treat as asserted-but-wrong."""
    k = KINDS[e.kind]
    rng = g.rng
    host_main = f"www.{slugify(e.name)}.example"
    others = [a for a in ATTR_TYPES if a not in needed and a not in omit]
    rng.shuffle(others)
    profile_attrs = [a for a in needed if a not in omit] + others[:3]
    intro = f"{e.name} is {a_an(k['noun'])} based in {e.attrs['place']}."
    body = " ".join(attr_sentence(e, a) for a in profile_attrs if a != "place")
    praise = rng.choice(["a local landmark", "a quiet success story", "a favourite of the region", "an institution"])
    g.add_doc(host_main, "about", f"About {e.name}", f"{intro} {body} Visitors often describe it as {praise}.", 2024)
    # same entity, other attributes (two news pieces)
    for j in range(2):
        a1, a2 = others[3 + 2 * j], others[4 + 2 * j]
        g.add_doc(
            f"{k['host']}-news.example",
            slugify(e.name),
            f"{e.name}: news from {e.attrs['place']}",
            f"Local reporters visited {e.name} this season. {attr_sentence(e, a1)} {attr_sentence(e, a2)} "
            f"{rng.choice(FILLER).format(scene=k['scene'])}",
            2023 - j,
        )
    alts: dict[str, list[str]] = {}
    cur = next(c for c in CURRENCIES if c[1] in e.attrs["price"])
    for a in needed:
        # similar names with the same attribute and a different value
        for _ in range(2):
            sim = g.similar(e.name)
            v = g.value(ATTR_TYPES[a], cur)
            g.add_doc(
                f"{k['host']}-directory.example",
                slugify(sim),
                f"{sim} directory entry",
                f"{sim} is {a_an(k['noun'])} not to be confused with similarly named ones. "
                f"{attr_sentence(e, a, v, name=sim)}",
                2022,
            )
        if outdated and a not in omit:
            old = g.value(ATTR_TYPES[a], cur)
            while old == e.attrs[a]:
                old = g.value(ATTR_TYPES[a], cur)
            alts[a] = [old]
            g.add_doc(
                "archive-listings.example",
                slugify(e.name),
                f"Archived listing: {e.name} (2009)",
                f"This archived 2009 listing has not been updated. At the time: "
                f"{attr_sentence(e, a, old)} Figures may have changed since.",
                2009,
            )
    return alts


def currency_docs(g: Gen) -> None:
    """Exchange-rate documents shared by all currency tasks (one current rate, one outdated, per currency)."""
    for sing, plur, rate, old in CURRENCIES:
        g.add_doc(
            "central-bank-rates.example",
            slugify(sing),
            f"{sing} to euro exchange rate",
            f"Reference exchange rate, updated 2024: one {sing} is worth {rate} euro. {plur.capitalize()} are "
            f"used across the northern provinces. The euro exchange rate is published every morning.",
            2024,
        )
        g.add_doc(
            "archive-listings.example",
            slugify(sing),
            f"Historic {sing} rates",
            f"Historic table from 2011: the {sing} to euro exchange rate stood at {old} euro that year.",
            2011,
        )
