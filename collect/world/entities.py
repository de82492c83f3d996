"""The generator state: one `random.Random` stream, the names already used, and the growing web corpus.

`Gen` draws entity names, people, confusable names, dates and attribute values; `add_doc` appends a corpus document.
Every draw goes through `Gen.rng` in call order, which is what makes the world byte-identical per seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import date, timedelta

from collect.world.vocab import ATTR_TYPES, CODAS, CURRENCIES, FIRST_NAMES, KINDS, MIDS, MONTHS, ONSETS


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
        return r.choice(ONSETS) + r.choice(MIDS) + r.choice(CODAS)

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
            name = f"{self.rng.choice(FIRST_NAMES)} {self.word()}"
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
