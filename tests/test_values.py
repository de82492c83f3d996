"""Values written the way people write them (collect/values.py): dates read by dateparser, quantities and number words
by quantulum3, each match explained (the span and what it was read as). Property tests: a date in 10 common formats
matches its ISO form; a quantity in 3 unit spellings and in words matches; a different day or number does not."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collect.values import find_value, same_value, value_in_text

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
_ONES = (_ONES + "seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def words(n: int) -> str:
    """English words for 1..999, written here independently of any parser ("three hundred and forty-two")."""
    hundreds, rest = divmod(n, 100)
    parts = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest:
        tens, ones = divmod(rest, 10)
        small = _ONES[rest] if rest < 20 else _TENS[tens - 2] + (f"-{_ONES[ones]}" if ones else "")
        parts.append(("and " if hundreds else "") + small)
    return " ".join(parts)


def ordinal(d: int) -> str:
    return f"{d}{'th' if 11 <= d % 100 <= 13 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"


# the 10 formats: day first, month first, ordinals with and without "of", abbreviated month with a dot, numeric with
# dots, slashes (day first) and dashes (ISO), a weekday in front
DATE_FORMATS = [
    lambda d: d.strftime("%d %B %Y"),
    lambda d: f"{d:%B} {d.day}, {d.year}",
    lambda d: f"the {ordinal(d.day)} of {d:%B} {d.year}",
    lambda d: f"{ordinal(d.day)} {d:%B}, {d.year}",
    lambda d: f"{d:%B} {ordinal(d.day)}, {d.year}",
    lambda d: f"{d.day} {d:%b}. {d.year}" if d.month != 5 else f"{d.day} May {d.year}",
    lambda d: d.strftime("%d.%m.%Y"),
    lambda d: d.strftime("%d/%m/%Y"),
    lambda d: d.isoformat(),
    lambda d: f"{d:%A}, {d.day} {d:%B} {d.year}",
]
DAYS = st.dates(min_value=date(1800, 1, 1), max_value=date(2099, 12, 31))


@settings(max_examples=25, deadline=None)
@given(day=DAYS, fmt=st.sampled_from(range(len(DATE_FORMATS))))
def test_a_date_in_ten_formats_matches_its_iso_form(day, fmt):
    written = DATE_FORMATS[fmt](day)
    text = f"The hall reopened on {written}, after the works."
    assert value_in_text(day.isoformat(), text), (written, text)
    assert same_value(written, day.isoformat()) and same_value(day.isoformat(), written)
    other = date.fromordinal(day.toordinal() + 1)
    assert not value_in_text(other.isoformat(), text), (written, other)


UNIT_SPELLINGS = {  # the gold's unit -> 3 spellings of it; {n} is the number
    "km": ["{n} km", "{n} kilometres", "{n}-kilometre"],
    "km/h": ["{n} km/h", "{n} kph", "{n} kilometres per hour"],
    "%": ["{n}%", "{n} percent", "{n} per cent"],
    "kn": ["{n} kn", "{n} knots", "{n} knot"],
    "€": ["€{n}", "{n} euros", "EUR {n}"],
}
WORD_UNIT = {"km": "kilometres", "km/h": "kilometres an hour", "%": "per cent", "kn": "knots", "€": "euros"}


def gold(n: int, unit: str) -> str:
    return f"€{n}" if unit == "€" else f"{n} {unit}" if unit != "%" else f"{n}%"


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 999), unit=st.sampled_from(sorted(UNIT_SPELLINGS)))
def test_a_quantity_in_three_unit_spellings_and_in_words_matches(n, unit):
    g = gold(n, unit)
    for spelling in UNIT_SPELLINGS[unit]:
        text = f"The figure given was {spelling.format(n=n)} last year."
        assert value_in_text(g, text), (g, text)
        assert not value_in_text(gold(n + 1, unit), text), (gold(n + 1, unit), text)
    spoken = f"the figure given was {words(n)} {WORD_UNIT[unit]} last year"
    assert value_in_text(g, spoken), (g, spoken)
    assert not value_in_text(gold(n + 1, unit), spoken)


@pytest.mark.parametrize(
    "value, text, span, reader",
    [
        # dates (issue 56, class 1)
        ("2019-03-05", "her maiden voyage on the 5th of March 2019, to Orm", "5th of March 2019", "dateparser"),
        ("17 September 2016", "was first held on 17 Sept. 2016 at the old harbour", "17 Sept 2016", "dateparser"),
        ("21 June 1987", "CORVELL TIDE MILL - RESTORED 21.06.1987", "21.06.1987", "dateparser"),
        ("14 March 1936", "It opened to traffic on March 14th, 1936, after four years of work.", "March 14th, 1936",
         "dateparser"),
        # quantities (class 2)
        ("90 km/h", "she cruises at ninety kilometres an hour", "ninety kilometres per hour", "quantulum3"),
        ("36 km/h", "the Orla Grey holds a steady 36 kph", "36 kph", "quantulum3"),
        ("40%", "Forty per cent of the members", "Forty percent", "quantulum3"),
        ("fourteen kilometres", "The loop is 14 km long", "14 km", "quantulum3"),
        ("22 kn", "a service speed of twenty-two knots", "twenty-two knots", "quantulum3"),
        ("12", "a dozen boats", "a dozen", "quantulum3"),
        ("2", "it won the cup twice", "twice", "quantulum3"),
    ],
)  # fmt: skip
def test_each_match_says_which_span_matched_and_as_what(value, text, span, reader):
    m = find_value(value, text)
    assert m is not None and m.span == span and m.reader == reader, m
    assert span in m.describe() and m.reading in m.describe()


@pytest.mark.parametrize(
    "value, text",
    [
        ("2019-03-05", "on the 5th of March 2018"),  # another year
        ("2019-03-05", "updated 03.05.2019"),  # day first: the 3rd of May
        ("90 km/h", "the island is 90 km long"),  # a length is not a speed
        ("90 km/h", "it cruises at 90 mph"),
        ("40%", "40 members"),
        ("14 km", "between 10 and 18 km"),
        ("14 km", "a 10-18 km walk"),  # a range is no single value
        ("12", "two dozen boats"),
        ("Merrow Dawn", "the Merrow Down"),  # a look-alike name
        ("1921", "in 19210"),
    ],
)
def test_look_alikes_do_not_match(value, text):
    assert not value_in_text(value, text)


def test_whole_answers_compare_as_days_or_quantities():
    assert same_value("the 3rd of May, 1921", "3 May 1921") and same_value("May 3rd, 1921", "1921-05-03")
    assert same_value("twelve kilometres", "12 km") and same_value("90 kph", "90 km/h")
    assert not same_value("1920 or 1921", "1921") and not same_value("3 May 1921 or later", "3 May 1921")
    assert not same_value("12 miles", "12 km") and not same_value("Merrow Dawn", "Merrow Down")
