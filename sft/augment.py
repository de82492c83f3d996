"""Name-renaming augmentation of SFT rows (the embedded world's invented names).

Why: the tiny planner trained on teacher rows learns the syllables of the training split's names as a prior and, on
an unseen task, writes a name from that prior instead of copying the one in its ledger ("Nelmere Museum of Crafts"
for "Lovmere Museum of Crafts"; docs/training.md "Why the copying planner still fails"). A renamed copy of a row has
every invented name word replaced, consistently in prompt, completion and tools, by another word drawn at random from
the same syllables: the decision is unchanged, and only copying from the prompt predicts the name in the action.

An invented word is onset + middle + coda of collect.world.vocab (e.g. "Nelmere", "Dulby"); person surnames are such
words too. Confusable variants (collect.world.entities.Gen.similar: a letter doubled or changed) do not parse and stay
as they are, so a renamed row can lose a near-miss decoy but never gains a wrong name. Rows without such a word are not
copied. Offline world only: real data has no syllable vocabulary and is never augmented.
"""

from __future__ import annotations

import random
import re

from collect.world.entities import Gen
from collect.world.vocab import CODAS, MIDS, ONSETS


def _alt(parts: list[str]) -> str:
    return "|".join(re.escape(p) for p in sorted(parts, key=len, reverse=True))


NAME_WORD = re.compile(rf"\b(?:{_alt(ONSETS)})(?:{_alt(MIDS)})(?:{_alt(CODAS)})\b")


def name_words(text: str) -> list[str]:
    """The distinct invented words in `text`, in order of first appearance."""
    return list(dict.fromkeys(NAME_WORD.findall(text)))


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list | tuple):
        for v in x:
            yield from _strings(v)


def _map_strings(x, f):
    if isinstance(x, str):
        return f(x)
    if isinstance(x, dict):
        return {k: _map_strings(v, f) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_map_strings(v, f) for v in x]
    return x


def rename_row(row: dict, rng: random.Random) -> dict | None:
    """A copy of `row` with each invented word in any string value (keys stay) mapped to a fresh one (a bijection onto
    words the row does not contain), or None when the row has none. Strings holding JSON (a `tools` column, tool-call
    arguments serialised as text) are renamed inside as well: names are letters only, so no escaping changes."""
    words = list(dict.fromkeys(w for s in _strings(row) for w in NAME_WORD.findall(s)))
    if not words:
        return None
    gen, taken, mapping = Gen(rng), set(words), {}
    for w in words:
        while True:
            new = gen.word()  # the world's own name draw
            if new not in taken:
                break
        taken.add(new)
        mapping[w] = new
    return _map_strings(row, lambda s: NAME_WORD.sub(lambda m: mapping[m.group(0)], s))


def renamed_copies(rows: list[dict], copies: int, seed: int) -> list[dict]:
    """`copies` renamed copies of every row that has an invented word (seeded; the originals are not included)."""
    if copies < 0:
        raise ValueError(f"rename copies must be >= 0, got {copies}")
    rng = random.Random(seed)
    out = []
    for _ in range(copies):
        for r in rows:
            if (new := rename_row(r, rng)) is not None:
                out.append(new)
    return out
