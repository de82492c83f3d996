"""Faster SFT data preparation: the tokenizer encodes each chat turn once, not once per row and twice per row.

TRL's SFTTrainer prepares a prompt-completion row by rendering and tokenizing the prompt alone and then the prompt +
completion (to find where the completion starts and, with assistant_only_loss, which tokens are the assistant's).
A planner row is a long, mostly repeated text: on the demo's data ~6,000 characters of role prompt and tool schemas,
the same in every row, then the ledger view (~3,400), then the action (~100). With the tiny tokenizer this is ~3 ms of
encoding per text and ~36 s of the demo's 1000-step SFT before its first step (2 processes), again in the round's SFT.

A fast tokenizer splits its input at added tokens before anything else, and encodes the text between two of them
without looking across: `encode(a + "<|im_start|>" + b) == encode(a) + encode("<|im_start|>") + encode(b)` (offsets
shifted). So the text is cut at the template's special tokens (the turn markers), each piece is encoded once and
kept (LRU), and the pieces' encodings are merged (tokenizers.Encoding.merge, offsets growing). The role prompt and
schemas are then encoded once per process, a row's ledger view once for both of TRL's calls.

Used only around SFTTrainer's construction (`segment_cached`), i.e. only while TRL prepares the dataset; the
tokenizer is restored afterwards. It changes nothing TRL computes: the first `verify` texts are also encoded the plain
way and compared (ids, offsets, masks, tokens, sequence ids); any difference switches the cache off for the rest
of the run with a warning, as do inputs it does not handle (pairs, pre-split words, special tokens added by a
post-processor, truncation or padding set on the backend, special tokens encoded as text). What differs from a plain
encode:
word_ids restart at 0 in each piece (TRL reads ids and offsets; apply_chat_template's assistant masks read the
offsets in transformers 5.24 and `char_to_token`, i.e. offsets and sequence ids, in 5.17, the GPU stack's).
tests/test_sft_segment_cache.py checks TRL's prepared dataset is identical with and without it on harvested rows.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from contextlib import contextmanager

log = logging.getLogger(__name__)

ENCODING_FIELDS = ("ids", "offsets", "type_ids", "attention_mask", "special_tokens_mask", "tokens", "sequence_ids")


def split_tokens(backend) -> list[str]:
    """The added special tokens a text can safely be cut at: matched verbatim, nothing stripped around them."""
    return [
        t.content
        for t in backend.get_added_tokens_decoder().values()
        if t.special and not t.normalized and not t.lstrip and not t.rstrip and not t.single_word and t.content
    ]


class SegmentCachedBackend:
    """A `tokenizers.Tokenizer` stand-in whose plain single-text encodes reuse the encodings of repeated pieces.

    Everything else (attributes, other methods, the inputs listed in the module docstring) goes to the real backend.
    """

    _OWN = ("_backend", "_max_entries", "_verify", "_cache", "_split", "_checked", "_enabled", "stats")

    def __init__(self, backend, max_entries: int = 4096, verify: int = 16):
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_max_entries", max_entries)
        object.__setattr__(self, "_verify", verify)
        object.__setattr__(self, "_cache", OrderedDict())
        tokens = sorted(split_tokens(backend), key=len, reverse=True)
        split = re.compile("(" + "|".join(re.escape(t) for t in tokens) + ")") if tokens else None
        object.__setattr__(self, "_split", split)
        object.__setattr__(self, "_checked", 0)
        object.__setattr__(self, "_enabled", split is not None)
        object.__setattr__(self, "stats", {"texts": 0, "pieces": 0, "piece_hits": 0, "delegated": 0})

    # -- delegation: reads and writes of the backend's own attributes (post_processor, encode_special_tokens, ...)
    def __getattr__(self, name):
        return getattr(self._backend, name)

    def __setattr__(self, name, value):
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._backend, name, value)

    # datasets' map(num_proc=N) pickles the tokenizer into its workers: send the backend, not the cache
    def __getstate__(self):
        return {"backend": self._backend, "max_entries": self._max_entries, "verify": self._verify}

    def __setstate__(self, state):
        self.__init__(state["backend"], state["max_entries"], state["verify"])

    # -- encoding
    def _plain(self, add_special_tokens: bool, is_pretokenized: bool) -> bool:
        b = self._backend
        if not self._enabled or is_pretokenized or b.truncation is not None or b.padding is not None:
            return False
        if b.encode_special_tokens:
            return False
        post = b.post_processor
        return not (add_special_tokens and post is not None and post.num_special_tokens_to_add(False))

    def _piece(self, text: str):
        enc = self._cache.get(text)
        self.stats["pieces"] += 1
        if enc is not None:
            self._cache.move_to_end(text)
            self.stats["piece_hits"] += 1
            return enc
        enc = self._backend.encode(text, add_special_tokens=False)
        if not enc.offsets or enc.offsets[-1][1] != len(text):
            # merging shifts the next piece's offsets by this piece's last offset: it must end where the piece ends
            # (a normalizer that strips trailing spaces, for one, leaves them outside every token)
            self._disable(f"a piece's tokens end at {enc.offsets[-1][1] if enc.offsets else 0}, not {len(text)}")
        self._cache[text] = enc
        if len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)
        return enc

    def _encode_one(self, text: str):
        from tokenizers import Encoding

        if not self._enabled:  # switched off earlier in this run
            return self._backend.encode(text, add_special_tokens=False)
        pieces = [self._piece(p) for p in self._split.split(text) if p]
        if pieces:
            merged = Encoding.merge(pieces, growing_offsets=True)
            # merge keeps each piece's sequence-0 range, the last one winning: the text is one sequence, so all of
            # its tokens are sequence 0, as in a plain encode (`char_to_token` searches sequence 0's tokens only)
            merged.set_sequence_id(0)
        else:
            merged = self._backend.encode(text, add_special_tokens=False)
        self.stats["texts"] += 1
        if self._checked < self._verify:
            object.__setattr__(self, "_checked", self._checked + 1)
            plain = self._backend.encode(text, add_special_tokens=False)
            diff = [f for f in ENCODING_FIELDS if getattr(plain, f) != getattr(merged, f)]
            if diff:
                self._disable(f"piecewise encoding differs from the tokenizer's ({', '.join(diff)})")
        if not self._enabled:
            return self._backend.encode(text, add_special_tokens=False)
        return merged

    def _disable(self, why: str) -> None:
        if self._enabled:
            log.warning("segment cache off for the rest of this run: %s", why)
        object.__setattr__(self, "_enabled", False)

    def encode_batch(self, inputs, add_special_tokens: bool = True, is_pretokenized: bool = False):
        if not (self._plain(add_special_tokens, is_pretokenized) and all(isinstance(x, str) for x in inputs)):
            self.stats["delegated"] += 1
            return self._backend.encode_batch(
                inputs, add_special_tokens=add_special_tokens, is_pretokenized=is_pretokenized
            )
        return [self._encode_one(x) for x in inputs]

    def encode(self, sequence, pair=None, is_pretokenized: bool = False, add_special_tokens: bool = True):
        if pair is None and isinstance(sequence, str) and self._plain(add_special_tokens, is_pretokenized):
            return self._encode_one(sequence)
        self.stats["delegated"] += 1
        return self._backend.encode(
            sequence, pair, is_pretokenized=is_pretokenized, add_special_tokens=add_special_tokens
        )


@contextmanager
def segment_cached(tokenizer, enabled: bool = True):
    """Within the block, `tokenizer` (a transformers fast tokenizer) encodes through a SegmentCachedBackend; outside
    it, through its own backend again. Yields the cached backend (None when not enabled or not a fast tokenizer)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if not enabled or backend is None or not hasattr(backend, "encode_batch"):
        yield None
        return
    cached = SegmentCachedBackend(backend)
    tokenizer._tokenizer = cached
    try:
        yield cached
    finally:
        tokenizer._tokenizer = backend
