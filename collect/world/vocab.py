"""Vocabulary of the embedded world: syllables for invented names, entity kinds and their attribute phrases,
currencies, filler lines for media tracks, and the sentence / question / query-focus templates built from them.

Pure data and pure string functions: nothing here draws from the random stream.
"""

from __future__ import annotations

ONSETS = ["K", "V", "Th", "Br", "D", "M", "Qu", "Sel", "Or", "Hal", "T", "Gr", "L", "F", "Ash", "Wren", "Cal", "N"]
MIDS = ["el", "ar", "or", "ul", "en", "ir", "aw", "oth", "im", "ess", "and", "ov"]
CODAS = ["mora", "holt", "wick", "fen", "dale", "stead", "mere", "ford", "by", "ton", "ridge", "vale", "more", "ley"]
FIRST_NAMES = [
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


def a_an(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def slugify(s: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in s).strip("-")


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
