"""Deterministic generator of the embedded world: fictional entities, a web corpus with distractors, media assets as
annotation tracks, and tasks with gold evidence chains.

Everything is drawn from one `random.Random(seed)` stream in a fixed order, so the same seed gives byte-identical
JSON. Entity names are invented from syllables (checked unique), so no model can answer from memory.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta

from collect.ledger import ALL_TOOLS
from collect.tasks import AssetSpec, GoldNeed, Task, Tracks
from collect.world.compute import evaluate

FAMILIES = ("anchor_web", "anchor_compute", "media_mc", "conflict", "unanswerable", "multi_asset")
NO_WEB_TOOLS = [t for t in ALL_TOOLS if t != "web_search"]

_ONSETS = ["K", "V", "Th", "Br", "D", "M", "Qu", "Sel", "Or", "Hal", "T", "Gr", "L", "F", "Ash", "Wren", "Cal", "N"]
_MIDS = ["el", "ar", "or", "ul", "en", "ir", "aw", "oth", "im", "ess", "and", "ov"]
_CODAS = ["mora", "holt", "wick", "fen", "dale", "stead", "mere", "ford", "by", "ton", "ridge", "vale", "more", "ley"]
_FIRST = [
    "Orsolya",
    "Tamsin",
    "Edric",
    "Maelis",
    "Jorund",
    "Perpetua",
    "Idris",
    "Saoirse",
    "Bastien",
    "Linnea",
    "Casimir",
    "Odalys",
    "Ferris",
    "Wilhelmina",
    "Teodor",
    "Ysolde",
    "Anselm",
    "Rosalind",
    "Ivo",
    "Marisol",
    "Corvin",
    "Elodie",
    "Hamish",
    "Zofia",
]

# Fictional currencies: (singular, plural, current rate to euro, outdated rate)
CURRENCIES = [
    ("veldmark", "veldmarks", "0.37", "0.52"),
    ("Orrin crown", "Orrin crowns", "1.84", "1.61"),
    ("tessel", "tessels", "0.058", "0.071"),
    ("Haldane pound", "Haldane pounds", "2.26", "2.49"),
]

MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]

# Entity kinds: category, name pattern, and the phrases that describe each attribute in questions and documents.
KINDS: dict[str, dict] = {
    "ferry": dict(
        category="Travel & Transport",
        suffixes=["Ferries", "Ferry Line", "Island Ferries"],
        noun="ferry company",
        founded="was founded",
        milestone="launched its first night crossing",
        opened="began scheduled service",
        date2="received its deep-water harbour licence",
        price="a one-way adult ticket",
        length="the main crossing route",
        ext="the seasonal island extension",
        count="vessels in its fleet",
        per_unit="passengers each vessel carries",
        leader="managing director",
        place="home port",
        scene="the harbour",
        host="ferries",
    ),
    "museum": dict(
        category="History & Heritage",
        suffixes=["Museum", "Heritage Museum", "Museum of Crafts"],
        noun="museum",
        founded="was established",
        milestone="moved into its current building",
        opened="opened its doors to the public",
        date2="was named a national heritage site",
        price="a standard admission ticket",
        length="the indoor gallery walk",
        ext="the sculpture garden trail",
        count="exhibition halls",
        per_unit="display cases in each hall",
        leader="director",
        place="home town",
        scene="the main gallery",
        host="museums",
    ),
    "band": dict(
        category="Arts & Music",
        suffixes=["Owls", "Six", "Lanterns", "Collective"],
        noun="band",
        prefix="The",
        founded="was formed",
        milestone="released its debut album",
        opened="played its first public concert",
        date2="signed with its first record label",
        price="a ticket for its summer tour",
        length="the route of its coastal tour",
        ext="the encore leg of the tour",
        count="albums it has released",
        per_unit="songs on each album",
        leader="lead singer",
        place="home city",
        scene="the rehearsal room",
        host="music",
    ),
    "company": dict(
        category="Business & Economy",
        suffixes=["Foods", "Textiles", "Instruments", "Ceramics"],
        noun="company",
        founded="was founded",
        milestone="opened its first export office",
        opened="listed its shares on the exchange",
        date2="completed its merger with a regional rival",
        price="its flagship product",
        length="the conveyor line in its main plant",
        ext="the new packaging line",
        count="factories it operates",
        per_unit="workers at each factory",
        leader="chief executive",
        place="headquarters city",
        scene="the factory floor",
        host="business",
    ),
    "observatory": dict(
        category="Science & Technology",
        suffixes=["Observatory", "Research Station", "Space Laboratory"],
        noun="observatory",
        founded="was commissioned",
        milestone="recorded its first confirmed comet",
        opened="opened to visiting researchers",
        date2="installed its large radio dish",
        price="a public night tour",
        length="the access road to the summit",
        ext="the service tunnel",
        count="telescopes on site",
        per_unit="observation nights allocated to each telescope per season",
        leader="chief scientist",
        place="nearest town",
        scene="the dome",
        host="science",
    ),
    "club": dict(
        category="Sports",
        suffixes=["Rovers", "Athletic", "United", "Harriers"],
        noun="football club",
        founded="was founded",
        milestone="won its first league title",
        opened="played its first match at its stadium",
        date2="was promoted to the top division",
        price="an adult season ticket",
        length="the club's training trail",
        ext="the new running track",
        count="teams in its youth academy",
        per_unit="players in each youth team",
        leader="head coach",
        place="home town",
        scene="the stadium",
        host="sport",
    ),
    "trail": dict(
        category="Nature & Environment",
        suffixes=["Trail", "Ridge Path", "Coastal Way"],
        noun="hiking trail",
        founded="was designated",
        milestone="was extended to the sea cliffs",
        opened="opened to hikers",
        date2="received protected-area status",
        price="a day permit",
        length="the main trail",
        ext="the ridge spur",
        count="rest huts along the route",
        per_unit="beds in each hut",
        leader="chief ranger",
        place="trailhead village",
        scene="the trailhead",
        host="outdoors",
    ),
    "coop": dict(
        category="Food & Agriculture",
        suffixes=["Growers' Cooperative", "Orchard Cooperative", "Dairy Cooperative"],
        noun="cooperative",
        founded="was founded",
        milestone="won its first national produce award",
        opened="opened its farm shop",
        date2="received organic certification",
        price="a crate of its apples",
        length="the irrigation canal it maintains",
        ext="the new drainage channel",
        count="member farms",
        per_unit="hectares farmed by each member",
        leader="chairperson",
        place="market town",
        scene="the orchard",
        host="farming",
    ),
}

ATTR_TYPES = {
    "founded_year": "year",
    "milestone_year": "year",
    "opened_date": "date",
    "date2": "date",
    "price": "price",
    "length": "km",
    "ext": "km",
    "count": "int",
    "per_unit": "int",
    "leader": "person",
    "place": "place",
}
OBJECTS = [
    "a brass lantern",
    "a green umbrella",
    "a coil of rope",
    "a wicker basket",
    "a red thermos",
    "a folded map",
    "a clipboard",
    "a ship's bell",
    "a bundle of tickets",
    "a wooden oar",
    "a camera tripod",
    "a loaf of bread",
    "a tin whistle",
    "a blue flag",
]
EVENTS = [
    "ferry delay",
    "platform change",
    "storm warning",
    "lost child",
    "closing time",
    "gate change",
    "power cut",
    "road closure",
]
FILLER = [
    "The light shifts across {scene} as the camera pans slowly to the left.",
    "A few visitors chat quietly near the entrance while gulls circle overhead.",
    "The narrator pauses to describe the weather, which has turned grey and windy.",
    "Somebody off camera laughs, and the crowd begins to move towards {scene}.",
    "Old photographs on the wall show how the area looked several decades ago.",
    "The guide mentions that the local bakery opens before dawn on market days.",
    "Rain starts to fall and the microphone picks up the patter on the roof.",
    "A delivery van reverses past the camera, its warning beeper sounding.",
    "Children point at a model displayed in a glass case near {scene}.",
    "The host thanks the viewers for watching and promises a second episode.",
    "We hear that the nearby river floods almost every spring.",
    "An elderly man recalls the summer when the whole town turned out to help.",
]
FRAME_FILLER = [
    "Wide shot of {scene} in soft afternoon light; no readable text.",
    "Close-up of weathered stone steps and a painted railing.",
    "A crowd of visitors, several holding paper cups, blurred in motion.",
    "Drone view of the coastline with scattered fishing boats.",
    "Interior shot with wooden beams and hanging lamps.",
]
AUDIO_FILLER = [
    ("event", "Seagulls calling and distant waves."),
    ("music", "Soft acoustic guitar music."),
    ("event", "Footsteps on gravel and a door closing."),
    ("event", "Wind gusting against the microphone."),
    ("music", "A brass band plays a slow march in the distance."),
]


@dataclass
class Entity:
    id: str
    kind: str
    name: str
    attrs: dict[str, str]


@dataclass
class Gen:
    rng: random.Random
    used_names: set[str] = field(default_factory=set)
    corpus: list[dict] = field(default_factory=list)
    doc_seq: int = 0

    # ---- names and values -------------------------------------------------------------------------------------------
    def word(self) -> str:
        r = self.rng
        return r.choice(_ONSETS) + r.choice(_MIDS) + r.choice(_CODAS)

    def entity_name(self, kind: str) -> str:
        spec = KINDS[kind]
        while True:
            base = f"{self.word()} {self.rng.choice(spec['suffixes'])}"
            name = f"{spec['prefix']} {base}" if spec.get("prefix") else base
            if name not in self.used_names:
                self.used_names.add(name)
                return name

    def person(self) -> str:
        while True:
            name = f"{self.rng.choice(_FIRST)} {self.word()}"
            if name not in self.used_names:
                self.used_names.add(name)
                return name

    def similar(self, name: str) -> str:
        """A confusable variant of a name (one letter doubled, changed or a suffix swapped)."""
        for _ in range(50):
            words = name.split(" ")
            j = 1 if words[0] == "The" else 0
            w = words[j]
            op = self.rng.randrange(3)
            if op == 0:
                k = self.rng.randrange(1, len(w))
                w2 = w[:k] + w[k - 1] + w[k:]
            elif op == 1:
                k = self.rng.randrange(1, len(w))
                w2 = w[:k] + self.rng.choice("aeiouy") + w[k + 1 :]
            else:
                w2 = w[:-2] + self.rng.choice(["a", "e", "o"]) + w[-1]
            words[j] = w2
            cand = " ".join(words)
            if cand not in self.used_names and cand != name:
                self.used_names.add(cand)
                return cand
        raise RuntimeError(f"no similar name for {name!r}")

    def day(self, lo: int, hi: int) -> date:
        start = date(lo, 1, 1)
        return start + timedelta(days=self.rng.randrange((date(hi, 12, 31) - start).days))

    def value(self, typ: str, currency: tuple) -> str:
        r = self.rng
        if typ == "year":
            return str(r.randrange(1890, 1990))
        if typ == "date":
            d = self.day(1990, 2012)
            return f"{d.day} {MONTHS[d.month - 1]} {d.year}"
        if typ == "price":
            return f"{r.randrange(4, 90)}.{r.choice(['00', '50', '25', '75'])} {currency[1]}"
        if typ == "km":
            return f"{r.randrange(12, 180) / 10:.1f} km"
        if typ == "int":
            return str(r.randrange(3, 40))
        if typ == "person":
            return self.person()
        if typ == "place":
            return self.word()
        raise ValueError(typ)

    def make_entity(self, kind: str, idx: int) -> Entity:
        cur = self.rng.choice(CURRENCIES)
        attrs = {a: self.value(t, cur) for a, t in ATTR_TYPES.items()}
        # consistent chronology: milestone after founding, date2 after opening
        attrs["milestone_year"] = str(int(attrs["founded_year"]) + self.rng.randrange(3, 60))
        d1 = self.day(1990, 2008)
        d2 = d1 + timedelta(days=self.rng.randrange(40, 3000))
        attrs["opened_date"] = f"{d1.day} {MONTHS[d1.month - 1]} {d1.year}"
        attrs["date2"] = f"{d2.day} {MONTHS[d2.month - 1]} {d2.year}"
        attrs["per_unit"] = str(self.rng.randrange(12, 400))
        return Entity(f"e{idx}", kind, self.entity_name(kind), attrs)

    # ---- documents --------------------------------------------------------------------------------------------------
    def add_doc(self, host: str, slug: str, title: str, text: str, year: int) -> dict:
        self.doc_seq += 1
        d = self.day(year, year)
        doc = {
            "id": f"d{self.doc_seq:05d}",
            "url": f"https://{host}/{slug}-{self.doc_seq}",
            "title": title,
            "text": text,
            "date": d.isoformat(),
        }
        self.corpus.append(doc)
        return doc


def a_an(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def slugify(s: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in s).strip("-")


def attr_sentence(e: Entity, attr: str, v: str | None = None, name: str | None = None) -> str:
    k = KINDS[e.kind]
    n = name or e.name
    v = v if v is not None else e.attrs[attr]
    return {
        "founded_year": f"{n} {k['founded']} in {v}.",
        "milestone_year": f"{n} {k['milestone']} in {v}.",
        "opened_date": f"{n} {k['opened']} on {v}.",
        "date2": f"{n} {k['date2']} on {v}.",
        "price": f"The price of {k['price']} from {n} is {v}.",
        "length": f"The length of {k['length']} of {n} is {v}.",
        "ext": f"The length of {k['ext']} of {n} is {v}.",
        "count": f"The number of {k['count']} at {n} is {v}.",
        "per_unit": f"The number of {k['per_unit']} at {n} is {v}.",
        "leader": f"The {k['leader']} of {n} is {v}.",
        "place": f"The {k['place']} of {n} is {v}.",
    }[attr]


def attr_focus(kind: str, attr: str) -> str:
    """Short attribute description used as query_focus (the planner prepends the entity name)."""
    k = KINDS[kind]
    return {
        "founded_year": f"year it {k['founded']}",
        "milestone_year": f"year it {k['milestone']}",
        "opened_date": f"date it {k['opened']}",
        "date2": f"date it {k['date2']}",
        "price": f"price of {k['price']}",
        "length": f"length of {k['length']}",
        "ext": f"length of {k['ext']}",
        "count": f"number of {k['count']}",
        "per_unit": f"number of {k['per_unit']}",
        "leader": f"{k['leader']}",
        "place": f"{k['place']}",
    }[attr]


def attr_question(kind: str, attr: str) -> str:
    k = KINDS[kind]
    return {
        "founded_year": f"In what year {k['founded'].replace('was ', 'was it ')}",
        "milestone_year": f"In what year did it {_base(k['milestone'])}",
        "opened_date": f"On what date did it {_base(k['opened'])}",
        "date2": f"On what date did it {_base(k['date2'])}",
        "price": f"What is the price of {k['price']}",
        "length": f"How long is {k['length']}",
        "ext": f"How long is {k['ext']}",
        "count": f"How many {k['count']} does it have",
        "per_unit": f"How many {k['per_unit']} are there",
        "leader": f"Who is its {k['leader']}",
        "place": f"What is its {k['place']}",
    }[attr]


_IRREGULAR = {
    "won": "win",
    "was": "be",
    "began": "begin",
    "moved": "move",
    "received": "receive",
    "played": "play",
    "released": "release",
    "signed": "sign",
    "opened": "open",
    "launched": "launch",
    "recorded": "record",
    "installed": "install",
    "completed": "complete",
    "listed": "list",
}


def _base(phrase: str) -> str:
    first, _, rest = phrase.partition(" ")
    if first == "was":
        return "become " + rest if rest.startswith(("named", "promoted")) else "get " + rest
    return f"{_IRREGULAR.get(first, first)} {rest}"


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


# ---- media tracks ---------------------------------------------------------------------------------------------------


def base_tracks(g: Gen, kind: str, duration: float, decoys: list[str]) -> dict:
    """Filler subtitles, audio, clips and frames over the whole duration; decoy names appear late in the video."""
    rng = g.rng
    scene = KINDS[kind]["scene"]
    tr = new_tracks()
    t = 2.0
    while t < duration - 6:
        text = rng.choice(FILLER).format(scene=scene)
        tr["subtitles"].append({"start": t, "end": t + 4.0, "text": text})
        t += rng.choice([8.0, 10.0, 12.0])
    for j in range(int(duration // 30) + 1):
        s = min(duration - 4, 5.0 + 30 * j + rng.randrange(0, 10))
        kind_a, text = rng.choice(AUDIO_FILLER)
        tr["audio"].append({"start": s, "end": s + 4.0, "kind": kind_a, "text": text})
    for j in range(int(duration // 40) + 1):
        s = 40.0 * j
        tr["clips"].append(
            {
                "start": s,
                "end": min(duration, s + 40.0),
                "caption": f"The camera explores {scene}; " + rng.choice(FRAME_FILLER).format(scene=scene).lower(),
            }
        )
        tr["frames"].append({"t": s + 3.0, "description": rng.choice(FRAME_FILLER).format(scene=scene), "ocr": ""})
    for j, d in enumerate(decoys):
        tt = duration - 20.0 + 6 * j
        tr["subtitles"].append({"start": tt, "end": tt + 4.0, "text": f"Later the guide compares it with {d}."})
    return tr


def new_tracks(**kw) -> dict:
    return {"subtitles": [], "audio": [], "clips": [], "frames": [], **kw}


def sort_tracks(tr: dict) -> Tracks:
    data = {k: list(v) for k, v in tr.items()}
    for key in ("subtitles", "audio", "clips"):
        data[key].sort(key=lambda x: (x["start"], x.get("text", x.get("caption", ""))))
    data["frames"].sort(key=lambda x: (x["t"], x["description"]))
    return Tracks.model_validate(data)


def place_anchor(g: Gen, tr: dict, e: Entity, source: str, window: tuple[float, float]) -> None:
    """Put the entity's name into one track inside the window."""
    k = KINDS[e.kind]
    t = window[0] + 3.0
    # clear filler in the window so the anchor is the only named thing there
    tr["subtitles"] = [s for s in tr["subtitles"] if not (window[0] - 4 <= s["start"] <= window[1])]
    if source == "subtitle":
        tr["subtitles"].append(
            {
                "start": t,
                "end": t + 5.0,
                "text": g.rng.choice(
                    [
                        f"And here we are at {e.name}, right in the middle of {k['scene']}.",
                        f"Our next stop is {e.name}, which locals will tell you about for hours.",
                        f"This is {e.name}; the {k['leader']} kindly agreed to show us around.",
                    ]
                ),
            }
        )
    elif source == "visual":
        tr["frames"].append(
            {
                "t": t,
                "description": f"A painted sign at {k['scene']} shows the name of the {k['noun']}.",
                "ocr": e.name.upper(),
            }
        )
    else:
        tr["audio"].append(
            {
                "start": t,
                "end": t + 5.0,
                "kind": "speech",
                "text": f"Announcer: Welcome, everyone, to {e.name}. Please keep to the marked paths.",
            }
        )


def fmt_window(w: tuple[float, float]) -> str:
    return f"between {int(w[0])} s and {int(w[1])} s"


# ---- task families --------------------------------------------------------------------------------------------------


def _video(g: Gen, aid: str, kind: str, decoys: list[str], dur: float | None = None) -> dict:
    """A video asset as a plain dict (validated into AssetSpec once the task is complete)."""
    dur = dur or float(g.rng.choice([90, 120, 150, 180, 240]))
    return {
        "id": aid,
        "type": "video",
        "duration": dur,
        "path": f"embedded/{aid}.mp4",
        "tracks": base_tracks(g, kind, dur, decoys),
    }


def _anchor(g: Gen, e: Entity, asset: dict, source: str, timed: bool) -> tuple[GoldNeed, str]:
    """Place the anchor; returns (anchor need, question phrase that points at it)."""
    k = KINDS[e.kind]
    start = float(g.rng.randrange(10, int(asset["duration"]) - 60, 5))
    win = (start, start + 15.0)
    place_anchor(g, asset["tracks"], e, source, win)
    where = {"subtitle": "the narrator names", "visual": "a sign shows the name of", "audio": "an announcer names"}
    if timed or source != "visual":
        phrase = f"{fmt_window(win)} of {asset['id']}, {where[source]} {a_an(k['noun'])}"
        focus = f"name of the {k['noun']} {fmt_window(win)}"
    else:
        phrase = f"in {asset['id']}, a sign shows the name of {a_an(k['noun'])}"
        focus = f"sign with the name of the {k['noun']}"
    return GoldNeed(
        need=f"identify the {k['noun']} named in {asset['id']}",
        need_role="anchor",
        preferred_source=source,
        query_focus=focus,
        gold_value=e.name,
    ), phrase


def fam_anchor_web(g: Gen, e: Entity, decoys: list[str]):
    src = g.rng.choice(["subtitle", "visual", "audio"])
    diff = "Easy" if src == "subtitle" else "Medium"
    v = _video(g, "video_1", e.kind, decoys)
    n0, phrase = _anchor(g, e, v, src, timed=g.rng.random() < 0.5)
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


def fam_anchor_compute(g: Gen, e: Entity, decoys: list[str]):
    ck = g.rng.choice(list(COMPUTE_KINDS))
    attrs, expr, _ = COMPUTE_KINDS[ck]
    src = g.rng.choice(["subtitle", "visual", "audio"])
    v = _video(g, "video_1", e.kind, decoys)
    n0, phrase = _anchor(g, e, v, src, timed=True)
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


def fam_media_mc(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    v = _video(g, "video_1", e.kind, decoys)
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


def fam_conflict(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    k = KINDS[e.kind]
    v = _video(g, "video_1", e.kind, decoys)
    n0, phrase = _anchor(g, e, v, "subtitle", timed=True)
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


def fam_unanswerable(g: Gen, e: Entity, decoys: list[str]):
    rng = g.rng
    k = KINDS[e.kind]
    v = _video(g, "video_1", e.kind, decoys)
    attr = rng.choice(["founded_year", "leader", "count", "milestone_year"])
    if rng.random() < 0.6:  # the web fact does not exist for this entity (only for similar names)
        n0, phrase = _anchor(g, e, v, rng.choice(["subtitle", "visual", "audio"]), timed=True)
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


def fam_multi_asset(g: Gen, e: Entity, decoys: list[str]):
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
        v1 = _video(g, "video_1", e.kind, decoys)
        n0, phrase = _anchor(g, e, v1, "subtitle", timed=True)
        v2 = _video(g, "video_2", e.kind, [], dur=60.0)
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


FAMILY_FUNCS = {
    "anchor_web": fam_anchor_web,
    "anchor_compute": fam_anchor_compute,
    "media_mc": fam_media_mc,
    "conflict": fam_conflict,
    "unanswerable": fam_unanswerable,
    "multi_asset": fam_multi_asset,
}
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
