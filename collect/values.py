"""Is this value in this text? The one answer the offline teacher's critic, its evidence lines and the robust scorer
share (docs/world.md, "Values written the way people write them").

Two readings, the first that finds the value wins, and each says what matched (`ValueMatch`: the span of the text,
what it was read as, and which reader read it), so a trajectory can show why a need was filled:

1. **exact** (the embedded world's reading, unchanged): a number compares numerically with every number written in
   digits in the text (`1,250` = `1250`, `1910` is not in `19100`); any other value matches case-insensitively as
   whole words.
2. **normalized**, by maintained parsers:
   - dates: `dateparser` (day-month-year order for numeric dates; a date needs its day, month and year): the value
     and the text's dates are read as calendar days, so `the 5th of March 2019` = `5 Mar. 2019` = `05.03.2019` =
     `2019-03-05`;
   - quantities and number words: `quantulum3`: the number with its unit, units compared by the unit the parser
     names, so `90 km/h` = `90 kph` = `ninety kilometres per hour`, `14 km` = `a 14-kilometre`, `€45` = `45 euros`,
     `3.5` = `three and a half`, `12` = `a dozen`, `1200000` = `1.2 million`; a value without a unit matches the
     number with any unit, a value with a unit needs the same unit;
   - names: case, accents and punctuation are ignored (`Château Verrin` = `CHATEAU VERRIN`), still as whole words.

What the parsers miss and is rewritten before they read (`_PREPARE`), each a spelling the parser reads once
rewritten: `per cent` (read as "per US cent"), `<unit> an hour` (read as two quantities), a space between a currency
sign or code and its amount (`€ 45`, `EUR 45`), a narrow or no-break space between digit groups (`48 250`; an
ordinary space between two numbers keeps them apart), the dot of an abbreviated month before a number (`5 Mar. 2019`:
dateparser's search splits at full stops), and `once`/`twice`/`thrice` (no parser reads them). A match's `span` is
the words as the parser read them (after these rewrites).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
import warnings
from dataclasses import dataclass
from datetime import date

_NUM_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
DATE_SETTINGS = {
    "DATE_ORDER": "DMY",  # 05.03.2019 is the 5th of March (the convention of the project's corpora)
    "REQUIRE_PARTS": ["day", "month", "year"],  # "May 2019" or "1921" alone is not a day
    "PARSERS": ["absolute-time"],  # no "today" / "3 days ago": those are not dates of a fact
    "PREFER_DAY_OF_MONTH": "first",
}


@dataclass(frozen=True)
class ValueMatch:
    """Where a value was found in a text: `span` (the text's words), `reading` (what they were read as), `reader`
    (exact | dateparser | quantulum3 | folded)."""

    value: str
    span: str
    reading: str
    reader: str

    @property
    def exact(self) -> bool:
        return self.reader == "exact"

    def describe(self) -> str:
        return f"{self.value!r} found as {self.span!r}, read as {self.reading} ({self.reader})"


def value_in_text(value: str, text: str) -> bool:
    """Does the text assert this value? (exact reading, then the normalized one; module docstring)"""
    return find_value(value, text) is not None


def value_matches(value: str, text: str) -> bool:
    """The normalized reading alone (dates, quantities, number words, folded names)."""
    return find_normalized(value, text) is not None


def find_value(value: str, text: str) -> ValueMatch | None:
    return find_exact(value, text) or find_normalized(value, text)


# ---- exact reading ------------------------------------------------------------------------------------------------


def as_number(s: str) -> float | None:
    t = s.strip().replace(",", "")
    if re.fullmatch(r"-?\d+(?:\.\d+)?", t):
        return float(t)
    return None


def same_number(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def find_exact(value: str, text: str) -> ValueMatch | None:
    num = as_number(value)
    if num is not None:
        for m in _NUM_RE.finditer(text):
            try:
                x = float(m.group().replace(",", ""))
            except ValueError:
                continue
            if same_number(x, num):
                return ValueMatch(value, m.group(), f"the number {x:g}", "exact")
        return None
    v = re.sub(r"\s+", " ", value.strip())
    t = re.sub(r"\s+", " ", text)
    m = re.search(r"(?<!\w)" + re.escape(v) + r"(?!\w)", t, re.IGNORECASE)
    return ValueMatch(value, m.group(), "the same words", "exact") if m else None


def exact_in_text(value: str, text: str) -> bool:
    return find_exact(value, text) is not None


# ---- normalized reading -------------------------------------------------------------------------------------------


def find_normalized(value: str, text: str) -> ValueMatch | None:
    if not value.strip():
        return None
    day = parse_date(value)
    if day is not None:
        return _find_date(value, day, text)
    q = parse_quantity(value)
    if q is not None:
        return _find_quantity(value, q, text)
    v = fold(value)
    if not v:
        return None
    m = re.search(r"(?<![a-z0-9])" + re.escape(v) + r"(?![a-z0-9])", fold(text))
    return ValueMatch(value, m.group(), "the same name (case, accents, punctuation ignored)", "folded") if m else None


def fold(text: str) -> str:
    """Lowercase, accents dropped, every run of other characters a single space."""
    t = unicodedata.normalize("NFKD", text)
    t = "".join(c for c in t if not unicodedata.combining(c)).lower()
    return re.sub(r"[^a-z0-9%€$£.]+", " ", t).strip()


# dates -----------------------------------------------------------------------------------------------------------


@functools.cache
def _dateparser():
    import dateparser
    from dateparser.search import search_dates

    return dateparser, search_dates


@functools.lru_cache(maxsize=4096)
def parse_date(value: str) -> date | None:
    """The calendar day a whole value names (None: it is not a full date, or not only a date)."""
    v = value.strip()
    if not re.search(r"\d", v) or not re.search(r"\d{4}", v) or len(v) > 40:
        return None  # every date the project reads has a four-digit year
    if as_number(v) is not None:
        return None  # "1921", "3.5", "1,250"
    dp, _ = _dateparser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = dp.parse(v, languages=["en"], settings=DATE_SETTINGS)
    return d.date() if d is not None else None


# dateparser's search splits the text at a full stop, so the dot of an abbreviated month ("5 Mar. 2019", "Sept. 5")
# is dropped before it reads: a capitalised word of 3-4 letters, a dot, a space and a digit
_ABBREV_DOT = re.compile(r"\b([A-Z][a-z]{2,3})\.(?=\s+\d)")


@functools.lru_cache(maxsize=8192)
def dates_in(line: str) -> tuple[tuple[str, date], ...]:
    """(span, day) of every full date dateparser finds in one line of text."""
    _, search = _dateparser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = search(_ABBREV_DOT.sub(r"\1", line), languages=["en"], settings=DATE_SETTINGS) or []
    return tuple((span.strip(), d.date()) for span, d in found)


def _find_date(value: str, day: date, text: str) -> ValueMatch | None:
    year = str(day.year)
    for line in text.splitlines():
        if year not in line:
            continue  # a date is written with its year: a line without it cannot hold this date
        found = dates_in(line)
        for span, d in found:
            if d == day:
                return ValueMatch(value, _tight(span, day), f"the date {d.isoformat()}", "dateparser")
        span = _date_near_year(line, year, day, tuple(s for s, _ in found))
        if span is not None:
            return ValueMatch(value, span, f"the date {day.isoformat()}", "dateparser")
    return None


_EDGE = " ,.;:()[]\"'"


def _tight(span: str, day: date) -> str:
    """The search's span without the words around the date it keeps ("on 17 Sept 2016 at the" -> "17 Sept 2016"):
    edge words are dropped while dateparser still reads the same day."""
    dp, _ = _dateparser()
    words = span.split()

    def same(ws: list[str]) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = dp.parse(" ".join(ws).strip(_EDGE), languages=["en"], settings=DATE_SETTINGS) if ws else None
        return d is not None and d.date() == day

    while len(words) > 1 and same(words[1:]):
        words = words[1:]
    while len(words) > 1 and same(words[:-1]):
        words = words[:-1]
    return " ".join(words).strip(_EDGE)


@functools.lru_cache(maxsize=8192)
def _date_near_year(line: str, year: str, day: date, covered: tuple[str, ...]) -> str | None:
    """dateparser's search drops a date it cannot cut out of its clause ("on March 14th, 1936, after four years of
    work"): the words around each mention of the year that no found date covers are read by dateparser itself, a
    few words before the year and up to two after; the shortest reading of this day wins."""
    dp, _ = _dateparser()
    toks = [m.group() for m in re.finditer(r"\S+", line)]
    for i, tok in enumerate(toks):
        if year not in tok or any(tok.strip(_EDGE) in c for c in covered):
            continue
        windows = sorted(
            {
                " ".join(toks[a : b + 1]).strip(_EDGE)
                for a in range(max(0, i - 4), i + 1)
                for b in range(i, min(len(toks), i + 3))
            },
            key=len,
        )
        for w in windows:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                d = dp.parse(w, languages=["en"], settings=DATE_SETTINGS)
            if d is not None and d.date() == day:
                return w
    return None


# quantities ------------------------------------------------------------------------------------------------------

# Spellings quantulum3 misreads, rewritten before it reads (module docstring). Order matters.
_PREPARE = (
    (re.compile(r"(?<=\d)[\u00a0\u202f\u2009](?=\d{3}\b)"), ""),  # 48 250 with a narrow / no-break space
    (re.compile(r"(?<=\d) (?=\d)"), " ; "),  # an ordinary space keeps two numbers apart ("in 2019 48 people")
    (re.compile(r"\bper cent\b", re.IGNORECASE), "percent"),  # else "per US cent"
    (re.compile(r"(?<=[a-z]) (?:an?|each) (hour|minute|second|day|week|month|year)\b", re.IGNORECASE), r" per \1"),
    (re.compile(r"([€$£])\s+(?=\d)"), r"\1"),  # "€ 45"
    (re.compile(r"\b(EUR|USD|GBP|CHF)\s*(\d[\d,]*(?:\.\d+)?)"), r"\2 \1"),  # "EUR 45" -> "45 EUR"
)
_TIMES = {"once": 1.0, "twice": 2.0, "thrice": 3.0}  # multiplicative adverbs: no parser reads them


@dataclass(frozen=True)
class Quantity:
    number: float
    unit: str | None  # the unit quantulum3 names ("kilometre per hour"); None: a bare number
    span: str

    def reading(self) -> str:
        return f"{self.number:g} {self.unit}" if self.unit else f"the number {self.number:g}"


@functools.cache
def _quantulum():
    import logging

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "classifier dependencies not installed": the classifier is not used
        from quantulum3 import parser
        from quantulum3 import regex as qregex
    logging.getLogger("quantulum3").setLevel(logging.WARNING)
    words = re.compile(qregex.numberwords_regex(), re.IGNORECASE)
    return parser, words


def prepare(text: str) -> str:
    for pat, rep in _PREPARE:
        text = pat.sub(rep, text)
    return text


@functools.lru_cache(maxsize=16384)
def quantities_in(line: str) -> tuple[Quantity, ...]:
    """Every quantity quantulum3 reads in one line (plus once/twice/thrice)."""
    parser, words = _quantulum()
    out = [Quantity(n, None, w) for w in re.findall(r"[A-Za-z]+", line) if (n := _TIMES.get(w.lower()))]
    if not re.search(r"\d", line) and not words.search(line):
        return tuple(out)  # no digit and no number word: nothing to read
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = parser.parse(prepare(line))
    for q in found:
        try:
            n = float(q.value)
        except (TypeError, ValueError):
            continue
        if not math.isfinite(n) or q.uncertainty:  # a range ("10-12 km") is no single value
            continue
        unit = q.unit.name
        if unit == "dozen":
            n, unit = n * 12, "dimensionless"
        out.append(Quantity(n, None if unit == "dimensionless" else unit, q.surface))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def parse_quantity(value: str) -> Quantity | None:
    """The one quantity a whole value is ("12 km", "€45", "90 km/h", "3.5", "twenty-five"); None otherwise."""
    v = value.strip()
    if len(v) > 60:
        return None
    n = as_number(v)
    if n is not None:
        return Quantity(n, None, v)
    if v.lower() in _TIMES:
        return Quantity(_TIMES[v.lower()], None, v)
    qs = [q for q in quantities_in(v) if q.span]
    if len(qs) != 1:
        return None
    q = qs[0]
    rest = fold(prepare(v).replace(q.span, " ", 1))
    return q if not rest.strip(" .") else None  # the quantity is the whole value, nothing else


def _find_quantity(value: str, want: Quantity, text: str) -> ValueMatch | None:
    for line in text.splitlines():
        for q in quantities_in(line):
            if same_number(q.number, want.number) and (want.unit is None or q.unit == want.unit):
                return ValueMatch(value, q.span, q.reading(), "quantulum3")
    return None


# ---- whole answers (the robust scorer) ----------------------------------------------------------------------------


def same_value(answer: str, gold: str) -> bool:
    """The answer, as a whole, is the gold as a whole written another way: the same calendar day, or the same
    quantity (number and unit). Not a search: `1920 or 1921` is not `1921`."""
    a, g = str(answer).strip(), str(gold).strip()
    if not a or not g:
        return False
    gd = parse_date(g)
    if gd is not None:
        return parse_date(a) == gd
    gq = parse_quantity(g)
    if gq is not None and gq.unit is not None:
        aq = parse_quantity(a)
        return aq is not None and aq.unit == gq.unit and same_number(aq.number, gq.number)
    return False
