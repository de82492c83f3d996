"""sft/segment_cache.py against real tokenizers: the tiny planner tokenizer on recorded planner prompts (the cache
must give exactly the tokenizer's own encodings), and hand-built `tokenizers` tokenizers on which cutting at special
tokens is not exact or which the cache must not handle (it must notice and hand over). TRL's whole prepared dataset
with and without the cache, under every real chat template, is compared in tests/test_templates.py."""

import json
import logging
import pickle

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer

from sft.segment_cache import ENCODING_FIELDS, SegmentCachedBackend, segment_cached


def _fields(enc) -> dict:
    return {f: getattr(enc, f) for f in ENCODING_FIELDS}


@pytest.fixture(scope="module")
def planner_texts(tiny_model, recorded_states):
    """The tiny tokenizer and what TRL encodes for recorded teacher states: each prompt with the generation prompt,
    then prompt + the recorded action, plus texts that start, end or are made of special tokens."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    texts = []
    for r in recorded_states[:30]:
        tools = json.loads(r["tools"])
        action = json.loads(r["reference_action"])
        call = {"type": "function", "function": {"name": action["name"], "arguments": action["arguments"]}}
        full = r["prompt"] + [{"role": "assistant", "content": "", "tool_calls": [call]}]
        texts.append(tok.apply_chat_template(r["prompt"], tools=tools, tokenize=False, add_generation_prompt=True))
        texts.append(tok.apply_chat_template(full, tools=tools, tokenize=False))
    texts += [
        "",
        "<|im_start|>",
        "<|im_end|><|im_start|>",
        "<|im_start|>user\nété 東京 <tool_call>\n<|im_end|>\n",
        "x",
    ]
    return tok, texts


def test_cached_encodings_are_the_tokenizers_own_on_planner_prompts(planner_texts):
    tok, texts = planner_texts
    backend = tok.backend_tokenizer
    cached = SegmentCachedBackend(backend, verify=0)  # no sampling check: every text compared here instead
    for text in texts:
        assert _fields(cached.encode(text, add_special_tokens=False)) == _fields(
            backend.encode(text, add_special_tokens=False)
        ), text[:80]
    batch = cached.encode_batch(texts, add_special_tokens=False)
    assert [e.ids for e in batch] == [backend.encode(t, add_special_tokens=False).ids for t in texts]
    assert cached._enabled
    # the role prompt + tool schemas piece and each state's ledger view are encoded once and then reused
    assert cached.stats["piece_hits"] > cached.stats["pieces"] / 2, cached.stats
    assert cached.stats["delegated"] == 0


def test_cached_encodings_map_characters_to_tokens_as_the_tokenizer_does(planner_texts):
    """transformers 5.17 (the GPU stack) builds apply_chat_template's assistant masks with `char_to_token` on the
    encoding, 5.24 from its offsets. `char_to_token` only searches the tokens of sequence 0, so a merged encoding
    must give every token to sequence 0 (tokenizers' merge keeps only the last piece's range): otherwise every
    assistant span before the last piece maps to no token and TRL drops the row's labels."""
    tok, texts = planner_texts
    backend = tok.backend_tokenizer
    cached = SegmentCachedBackend(backend, verify=0)
    for text in [t for t in texts if t][:4] + texts[-4:]:
        plain, merged = backend.encode(text, add_special_tokens=False), cached.encode(text, add_special_tokens=False)
        assert merged.sequence_ids == plain.sequence_ids, text[:80]
        assert [merged.char_to_token(c) for c in range(len(text))] == [
            plain.char_to_token(c) for c in range(len(text))
        ]
        assert [merged.token_to_chars(i) for i in range(len(plain))] == [
            plain.token_to_chars(i) for i in range(len(plain))
        ]
    assert cached.stats["piece_hits"] > 0  # merged encodings were compared, not the tokenizer's own


def test_through_transformers_the_chat_template_and_assistant_masks_are_unchanged(planner_texts, recorded_states):
    tok, _ = planner_texts
    r = recorded_states[3]
    tools = json.loads(r["tools"])
    action = json.loads(r["reference_action"])
    full = r["prompt"] + [{"role": "assistant", "content": "", "tool_calls": [{"function": action}]}]
    kw = {"tools": tools, "tokenize": True, "return_dict": True, "return_assistant_tokens_mask": True}
    plain = tok.apply_chat_template(full, **kw)
    backend = tok._tokenizer
    with segment_cached(tok) as cached:
        assert tok._tokenizer is cached
        again = tok.apply_chat_template(full, **kw)
        twice = tok.apply_chat_template(full, **kw)
    assert tok._tokenizer is backend
    assert again["input_ids"] == twice["input_ids"] == plain["input_ids"]
    assert again["assistant_masks"] == plain["assistant_masks"] and 1 in plain["assistant_masks"]
    assert cached.stats["texts"] == 2 and cached.stats["piece_hits"] >= cached.stats["pieces"] // 2


def _word_tokenizer(normalizer=None, post_processor=None) -> Tokenizer:
    t = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "c": 3, "[CLS]": 4}, unk_token="[UNK]"))
    if normalizer is not None:
        t.normalizer = normalizer
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    if post_processor is not None:
        t.post_processor = post_processor
    return t


def test_a_tokenizer_whose_pieces_do_not_merge_exactly_turns_the_cache_off(caplog):
    """A Strip normalizer drops a piece's trailing spaces, so its tokens end before the piece does and merged offsets
    would shift: the cache must switch itself off and return the tokenizer's own encodings."""
    t = _word_tokenizer(normalizers.Strip())
    cached = SegmentCachedBackend(t)
    with caplog.at_level(logging.WARNING, logger="sft.segment_cache"):
        for text in ["a b  <s>  c ", "a<s>b", "c  <s>"]:
            assert _fields(cached.encode(text, add_special_tokens=False)) == _fields(
                t.encode(text, add_special_tokens=False)
            )
    assert not cached._enabled
    assert "segment cache off" in caplog.text


def test_a_difference_seen_by_the_sampling_check_turns_the_cache_off(caplog, monkeypatch):
    t = _word_tokenizer()
    cached = SegmentCachedBackend(t, verify=2)
    real_merge = __import__("tokenizers").Encoding.merge

    def wrong_merge(encodings, growing_offsets=True):  # a merge that loses the last piece
        return real_merge(encodings[:-1] or encodings, growing_offsets=growing_offsets)

    monkeypatch.setattr("tokenizers.Encoding.merge", wrong_merge)
    with caplog.at_level(logging.WARNING, logger="sft.segment_cache"):
        out = cached.encode("a b<s>c", add_special_tokens=False)
    assert out.ids == t.encode("a b<s>c", add_special_tokens=False).ids == [1, 2, 5, 3]
    assert not cached._enabled and "differs" in caplog.text


def test_inputs_the_cache_does_not_handle_go_to_the_tokenizer():
    cls = processors.TemplateProcessing(single="[CLS] $A", pair="[CLS] $A $B", special_tokens=[("[CLS]", 4)])
    t = _word_tokenizer(post_processor=cls)
    cached = SegmentCachedBackend(t)
    cases = [
        (("a<s>b",), {"add_special_tokens": True}),  # the post-processor adds [CLS]
        (("a", "b"), {"add_special_tokens": False}),  # a pair
        ((["a", "b"],), {"is_pretokenized": True, "add_special_tokens": False}),
    ]
    for args, kw in cases:
        assert _fields(cached.encode(*args, **kw)) == _fields(t.encode(*args, **kw))
    assert cached.encode_batch(["a<s>b"], add_special_tokens=True)[0].ids == [4, 1, 5, 2]
    assert cached.stats["delegated"] == 4 and cached.stats["texts"] == 0
    t.enable_truncation(2)
    assert cached.encode("a b<s>c", add_special_tokens=False).ids == [1, 2]  # truncation set: the tokenizer's own
    t.no_truncation()
    cached.encode_special_tokens = True  # attribute writes reach the real tokenizer
    assert t.encode_special_tokens is True
    assert cached.encode("a<s>", add_special_tokens=False).ids == t.encode("a<s>", add_special_tokens=False).ids
    assert cached.stats["texts"] == 0


def test_a_pickled_copy_keeps_the_tokenizer_but_not_the_cache(planner_texts):
    """datasets' map(num_proc=N) pickles the tokenizer into each worker."""
    tok, texts = planner_texts
    cached = SegmentCachedBackend(tok.backend_tokenizer)
    cached.encode(texts[0], add_special_tokens=False)
    copy = pickle.loads(pickle.dumps(cached))
    assert len(cached._cache) > 0 and len(copy._cache) == 0 and copy._enabled
    assert (
        copy.encode(texts[1], add_special_tokens=False).ids
        == tok.backend_tokenizer.encode(texts[1], add_special_tokens=False).ids
    )


def test_the_tokenizer_is_restored_when_the_block_fails(planner_texts):
    tok, _ = planner_texts
    backend = tok._tokenizer
    with pytest.raises(RuntimeError), segment_cached(tok):
        raise RuntimeError("TRL failed")
    assert tok._tokenizer is backend
    with segment_cached(tok, enabled=False) as cached:
        assert cached is None and tok._tokenizer is backend
