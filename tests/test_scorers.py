"""Scorer tables: each `official` row's expected verdict is what the reference scorer returns (read from its source:
GAIA leaderboard `question_scorer`; OmniGAIA `src/run_base_agent.py` extraction and `src/evaluate/eval_results.py`;
VLMEvalKit `vlmeval/dataset/utils/worldsense.py` `extract_characters_regex` and `WorldSense.evaluate`), with the rule
it exercises; the `robust` tables are the project's deliberate differences (collect/judges.py docstring)."""

from __future__ import annotations

import asyncio
import json

import pytest

from collect.judges import (
    JUDGE_MAX_TOKENS,
    extract_answer,
    gaia_quasi_exact,
    judge_embedded,
    omnigaia_em,
    omnigaia_judge,
    parse_judge_reply,
    resolve_mode,
    worldsense_correct,
    worldsense_extract,
)
from collect.tasks import Task

# ---------------------------------------------------------------------------------------------------------------------
# GAIA question_scorer: (answer, gold, official verdict, robust verdict, rule)
# ---------------------------------------------------------------------------------------------------------------------
GAIA = [
    # gold float()-able -> number: answer loses $ % , then float(); exact equality
    ("790", "790", True, True, "number: same"),
    ("790.0", "790", True, True, "number: float equality"),
    ("791", "790", False, False, "number: different"),
    ("$1,250", "1250", True, True, "number: answer drops $ and ,"),
    ("1,250", "1250", True, True, "number: answer drops the thousands comma"),
    ("50%", "50", True, True, "number: answer drops %"),
    ("about 790", "790", False, False, "number: text in the answer -> inf"),
    ("790 km", "790", False, False, "number: unit word -> inf"),
    (" 790 ", "790", True, True, "number: float() ignores surrounding whitespace"),
    ("1e3", "1000", True, True, "number: float() reads exponents"),
    ("7.9e2", "790", True, True, "number: float() reads exponents"),
    ("1_000", "1000", True, True, "number: float() accepts underscores"),
    ("0.30000000000000004", "0.3", False, True, "number: exact equality officially; robust has 1e-9 tolerance"),
    ("-3", "-3", True, True, "number: sign"),
    ("+3", "3", True, True, "number: float() reads a plus sign"),
    ("", "0", False, False, "number: empty answer -> inf"),
    ("garbage", "inf", True, False, "number: an unparseable answer is inf and equals a gold 'inf' (quirk)"),
    ("nan", "nan", False, True, "number: nan != nan officially; robust compares 'nan' as a string"),
    ("1 000", "1000", False, True, "number: inner space is not dropped officially; robust drops it"),
    (None, "790", False, False, "None answer is 'None' -> inf"),
    # gold with , or ; -> list, split on [,;], same length, numeric elements as numbers, others keep punctuation
    ("1000", "1,000", False, True, "list: thousands comma makes the gold a list (quirk); robust reads a number"),
    ("1,000", "1,000", True, True, "list: element-wise 1 == 1 and 000 == 0"),
    ("1;0", "1,000", True, False, "list: '0' == float('000') element-wise (quirk)"),
    ("$1,250.50", "$1,250.50", True, True, "list: '$1' is a string element, '250.50' a number; robust: a number"),
    ("1250.5", "$1,250.50", False, True, "list: currency gold with comma is a list; robust reads a number"),
    ("Paris; Rome", "paris, rome", True, True, "list: ; and , both split, case-insensitive"),
    ("Paris,Rome", "Paris, Rome", True, True, "list: whitespace dropped in elements"),
    ("Paris", "paris, rome", False, False, "list: length mismatch"),
    ("Paris, Rome, Oslo", "Paris, Rome", False, False, "list: length mismatch"),
    ("St Louis, Paris", "St. Louis, Paris", False, True, "list: element punctuation kept officially"),
    ("Paris., Rome", "Paris, Rome", False, True, "list: trailing period in an element"),
    ("a-b, c", "ab, c", False, True, "list: hyphen kept in elements"),
    ("1, 2.50", "1, 2.5", True, True, "list: numeric elements compare as numbers"),
    ("1, $2.5", "1; 2.5", True, True, "list: numeric element drops $"),
    ("one, two", "1, 2", False, False, "list: words are not numbers"),
    ("Rome, Paris", "Paris, Rome", False, False, "list: order matters"),
    ("a,,b", "a,,b", True, True, "list: empty elements compare equal"),
    ("APPLE, pear", "apple, Pear", True, True, "list: case-insensitive elements"),
    # otherwise string: drop all whitespace, lowercase, drop ASCII punctuation
    ("The Quillwater Six!", "the quillwater six", True, True, "string: punctuation and case dropped"),
    ("sea gull", "seagull", True, True, "string: all whitespace dropped"),
    ("50", "50%", True, True, "string: percent gold is the string '50'"),
    ("50.0", "50%", False, True, "string: percent gold compares as a string officially (quirk)"),
    ("0.5", "50%", False, False, "string: no unit conversion"),
    ("50 %", "50%", True, True, "string: whitespace dropped"),
    ("None", "none", True, True, "string: plain"),
    (None, "None", True, False, "string: None answer is the string 'None' (quirk); robust: a missing answer is wrong"),
    ("St Louis", "St. Louis", True, True, "string: punctuation dropped outside lists"),
    ("café", "cafe", False, False, "string: accents are not punctuation"),
    ("Mr. O’Neil", "Mr ONeil", False, False, "string: the curly apostrophe is not ASCII punctuation"),
    ("Mr. O'Neil", "Mr ONeil", True, True, "string: the ASCII apostrophe is"),
    ("tab\tsep", "tabsep", True, True, "string: tabs are whitespace"),
    ("Seven", "7 ", False, False, "number gold with trailing space (float() strips): 'Seven' -> inf"),
    # robust: the gold's day or quantity written another way (collect.values.same_value); officially strings differ
    ("the 3rd of May, 1921", "3 May 1921", False, True, "robust: the same day written another way"),
    ("May 3rd, 1921", "1921-05-03", False, True, "robust: a written date against an ISO gold"),
    ("4 May 1921", "3 May 1921", False, False, "another day"),
    ("1920 or 1921", "1921", False, False, "two years are not one"),
    ("twelve kilometres", "12 km", False, True, "robust: the same quantity in words"),
    ("12 miles", "12 km", False, False, "another unit"),
]


@pytest.mark.parametrize(("pred", "gold", "official", "robust", "rule"), GAIA, ids=[r[4] for r in GAIA])
def test_gaia_question_scorer(pred, gold, official, robust, rule):
    assert gaia_quasi_exact(pred, gold) is official  # official is the default
    assert gaia_quasi_exact(pred, gold, "official") is official
    assert gaia_quasi_exact(pred, gold, "robust") is robust


def test_gaia_tables_are_big_enough():
    assert len(GAIA) >= 40 and len(OMNI_EXTRACT) + len(OMNI_EM) + len(JUDGE_REPLIES) >= 40
    assert len(WORLDSENSE) >= 40 and len(EMBEDDED_MC) >= 40


# ---------------------------------------------------------------------------------------------------------------------
# OmniGAIA: extraction (run_base_agent.py), EM (eval_results.py normalize_text), judge reply (check_equivalence)
# ---------------------------------------------------------------------------------------------------------------------
_W30 = " ".join(f"w{i}" for i in range(30))
OMNI_EXTRACT = [
    # (output, official extraction, robust extraction, rule)
    ("x <answer>a</answer> y <answer> b </answer>", "b", "b", "last block, stripped"),
    ("<answer>1962</answer>", "1962", "1962", "single block"),
    ("<ANSWER>1962</ANSWER>", "<ANSWER>1962</ANSWER>", "1962", "tags are case-sensitive officially -> last 20 words"),
    ("so <Answer>C</Answer>", "so <Answer>C</Answer>", "C", "mixed-case tag is no tag officially"),
    ("<answer>a <answer>b</answer>", "a <answer>b", "b", "non-greedy from the first <answer> (quirk)"),
    ("<answer>multi\nline</answer>", "multi\nline", "multi\nline", "DOTALL: a block spans lines"),
    ("<think><answer>x</answer></think>final <answer>y</answer>", "y", "y", "last block wins"),
    ("<think>maybe <answer>x</answer></think> so y", "x", "so y", "a block inside <think> counts officially"),
    ("<answer></answer>", "", "", "empty block -> empty answer"),
    ("<answer>  </answer>", "", "", "whitespace block -> empty after strip"),
    (_W30, " ".join(f"w{i}" for i in range(10, 30)), " ".join(f"w{i}" for i in range(10, 30)), "last 20 words"),
    ("a\n\tb   c", "a b c", "a b c", "fallback words are re-joined with single spaces"),
    ("<answer>unclosed", "<answer>unclosed", "<answer>unclosed", "an unclosed tag is no block"),
    ("", "", "", "empty output"),
    (None, "", "", "no output"),
]


@pytest.mark.parametrize(("text", "official", "robust", "rule"), OMNI_EXTRACT, ids=[r[3] for r in OMNI_EXTRACT])
def test_omnigaia_extract(text, official, robust, rule):
    assert extract_answer(text) == official
    assert extract_answer(text, "robust") == robust


OMNI_EM = [
    # (extracted, gold, official EM, robust EM, rule)
    ("790", "790", True, True, "identical"),
    ("Paris", "paris", True, True, "lowercased"),
    ("New  York\nCity", "new york city", True, True, "whitespace collapsed, newlines are spaces"),
    (" 790 ", "790", True, True, "surrounding whitespace"),
    ("790.0", "790", False, True, "no number parsing officially (the judge decides)"),
    ("$1,250", "1250", False, True, "no $ or , stripping officially"),
    ("The Quillwater Six!", "the quillwater six", False, True, "punctuation kept officially"),
    ("", "", False, False, "an empty prediction scores 0 even against an empty gold"),
    ("x", "", False, False, "non-empty prediction, empty gold"),
    ("ÉCOLE", "école", True, True, "unicode lowercase"),
]


@pytest.mark.parametrize(("pred", "gold", "official", "robust", "rule"), OMNI_EM, ids=[r[4] for r in OMNI_EM])
def test_omnigaia_em(pred, gold, official, robust, rule):
    assert omnigaia_em(pred, gold) is official
    assert omnigaia_em(pred, gold, "robust") is robust


JUDGE_REPLIES = [
    # (content, finish_reason, official verdict, robust verdict, rule); None = judge failure (retried, then unjudged)
    ("Correct", "stop", True, True, "plain Correct"),
    ("Incorrect", "stop", False, False, "plain Incorrect"),
    ("Correct.", "stop", True, True, "punctuation"),
    ("**Incorrect**", "stop", False, False, "markdown"),
    ("incorrect", "stop", True, False, "officially only 'Incorrect' (case-sensitive) fails (quirk)"),
    ("INCORRECT", "stop", True, False, "upper case is not 'Incorrect' officially (quirk)"),
    ("correct", "stop", True, True, "lowercase correct"),
    ("Correct, not Incorrect", "stop", False, False, "any 'Incorrect' fails officially"),
    ("not correct", "stop", True, False, "no 'Incorrect' -> pass officially; robust reads the negation"),
    ("<think>Incorrect? no.</think>Correct", "stop", True, True, "only the text after </think> counts"),
    ("<think>looks right</think>\nIncorrect", "stop", False, False, "verdict after </think>"),
    ("<think>a</think>x<think>b</think> Correct", "stop", True, True, "after the last </think>"),
    ("", "stop", None, None, "empty reply: failure (officially a pass)"),
    ("   ", "stop", None, None, "blank reply: failure"),
    ("<think>The labeled answer is 1962 but", "length", None, None, "truncated thinking: failure"),
    ("<think>The labeled answer is 1962 but", "stop", None, None, "unclosed think: failure"),
    ("Correct", "length", None, None, "finish_reason length: failure even with a word"),
    ("<think>Correct</think>", "stop", None, None, "nothing after </think>: failure"),
    ("Yes", "stop", None, None, "no verdict word: failure (officially a pass)"),
    ("The prediction matches.", "stop", None, None, "no verdict word: failure"),
    ("Incorrectly formatted", "stop", False, None, "official: holds 'Incorrect'; robust: not a verdict word"),
    # an upper-case think block is closed, not unclosed; the reference splits on the lower-case "</think>" only, so
    # officially the whole reply (block included) is read
    ("<THINK>looks right</THINK> Correct", "stop", True, True, "upper-case THINK block: closed"),
    ("<THINK>Incorrect? no.</THINK>Correct", "stop", False, True, "THINK: officially the block is read too"),
    ("<Think>same year</Think>\nIncorrect", "stop", False, False, "mixed-case Think block: verdict after it"),
    ("<THINK>The labeled answer is 1962 but", "stop", None, None, "unclosed upper-case THINK: failure"),
]


@pytest.mark.parametrize(
    ("content", "finish", "official", "robust", "rule"), JUDGE_REPLIES, ids=[r[4] for r in JUDGE_REPLIES]
)
def test_judge_reply_parsing(content, finish, official, robust, rule):
    assert parse_judge_reply(content, finish) is official
    assert parse_judge_reply(content, finish, "robust") is robust


# ---------------------------------------------------------------------------------------------------------------------
# WorldSense: VLMEvalKit extract_characters_regex, score = extracted == answer
# ---------------------------------------------------------------------------------------------------------------------
WS_OPTIONS = ["A. a rope", "B. a red thermos", "C. a green cup", "D. nothing"]
WORLDSENSE = [
    # (reply, official letter, robust letter, rule); None = unanswered
    ("B", "B", "B", "bare letter"),
    ("The best answer is B", "B", "B", "prefix deleted"),
    ("The correct answer is C.", "C", "C", "prefix deleted"),
    ("The answer is D", "D", "D", "prefix deleted"),
    ("The answer: D", "D", "D", "'The answer' deleted"),
    ("Answer: C", "C", "C", "'Answer:' deleted"),
    ("Option: A", "A", "A", "'Option:' deleted"),
    ("Answer: (C) the red one", "C", "C", "parenthesised letter"),
    ("(B)", "B", "B", "parenthesised letter"),
    ("**C**", "C", "C", "markdown bold"),
    ("C. a green cup", "C", "C", "letter with option text"),
    ("answer: c", None, "C", "lowercase letters never count officially"),
    ("c", None, "C", "lowercase letter"),
    ("b)", None, "B", "lowercase letter with paren"),
    ("Definitely C", "D", "C", "first capital A-D anywhere, even inside a word (quirk)"),
    ("Because of the rope, B", "B", "B", "'Because' starts with B, which happens to be right"),
    ("Because of the rope, A", "B", "A", "'Because' gives B (quirk)"),
    ("Best answer: C", "B", "C", "'Best answer:' is not deleted alone (missing comma) -> 'Best' gives B (quirk)"),
    ("The best option is D", "D", "D", "'The best option is' is not deleted alone, but no A-D before D"),
    ("The correct option is A", "A", "A", "likewise"),
    ("Best option: A", "B", "A", "'Best' gives B (quirk)"),
    ("the answer is C", "C", "C", "case-sensitive prefixes: 'the answer is' stays, C is the first capital"),
    ("Clearly A", "C", "A", "'Clearly' gives C (quirk)"),
    ("I think it is A", "A", "A", "'I' is not A-D"),
    ("Answer: The answer is B", "B", "B", "every prefix occurrence is deleted officially"),
    ("D is correct", "D", "D", "letter first"),
    ("A man holds a red thermos", "A", "B", "article A counts officially; robust: the reply names option B's text"),
    ("A man holds it", "A", "A", "no option text: the article A counts in both modes (documented)"),
    ("a red thermos", None, "B", "option text: unanswered officially; robust matches the option"),
    ("the person holds a red thermos in the clip", None, "B", "robust: exactly one option text inside"),
    ("", None, None, "empty"),
    ("   ", None, None, "blank"),
    ("E", None, None, "E is not an option"),
    ("I cannot tell from the video what the person is holding in their hand", None, None, ">10 words, no A-D"),
    ("the person in the video is holding something small but it is B", "B", "B", ">10 words with B"),
    ("ABCD", "A", None, "first capital; robust needs a letter standing alone"),
    ("Option B", "B", "B", "'Option' (no colon) is not a prefix but has no A-D before B"),
    ("Answer:B", "B", "B", "no space after the colon"),
    ("The answer isC", "C", "C", "officially the prefix goes, leaving 'C'"),
    ("My choice: D", "D", "D", "unknown prefix; first capital"),
    ("Dunno", "D", None, "'Dunno' gives D (quirk)"),
    ("(A) or (B)", "A", "A", "first letter"),
    ("none of these", None, None, "no letter"),
]


@pytest.mark.parametrize(("reply", "official", "robust", "rule"), WORLDSENSE, ids=[r[3] for r in WORLDSENSE])
def test_worldsense_extract(reply, official, robust, rule):
    assert worldsense_extract(reply) == official
    assert worldsense_extract(reply, "robust", WS_OPTIONS) == robust
    gold = official or "A"
    assert worldsense_correct(reply, gold) is (official is not None)


def test_worldsense_none_and_gold_is_exact():
    assert worldsense_extract(None) is None and not worldsense_correct(None, "A")
    assert not worldsense_correct("B", "b")  # VLMEvalKit compares with the gold letter as stored


# ---------------------------------------------------------------------------------------------------------------------
# Embedded judge, multiple choice: official = WorldSense official extraction; robust = letter or option text
# ---------------------------------------------------------------------------------------------------------------------
EMBEDDED_MC = [
    # (answer, official, robust, rule) against gold "C" with options WS_OPTIONS
    ("C", True, True, "bare letter"),
    ("The answer is C", True, True, "prefix"),
    ("Answer: C", True, True, "prefix with colon"),
    ("**C**", True, True, "markdown"),
    ("(C)", True, True, "parentheses"),
    ("C.", True, True, "period"),
    ("C)", True, True, "closing paren"),
    ("C. a green cup", True, True, "letter and option text"),
    ("c", False, True, "lowercase letter: official needs a capital"),
    ("c)", False, True, "lowercase with paren"),
    ("a green cup", False, True, "option text only"),
    ("A green cup", False, True, "capitalised option text: official reads 'A'; robust matches the text"),
    ("The green cup, C", True, True, "'The' has no A-D; C is the first capital"),
    ("Clearly C", True, True, "'Clearly' gives C officially (luck)"),
    ("Definitely C", False, True, "'Definitely' gives D officially (quirk)"),
    ("Best answer: C", False, True, "'Best' gives B officially (quirk)"),
    ("the answer is c", False, True, "all lowercase"),
    ("Option C", True, True, "option word"),
    ("option c", False, True, "lowercase option word"),
    ("I choose C", True, True, "'I' is not A-D"),
    ("The correct answer is: C", True, True, "colon after 'is'"),
    ("Final answer: C", True, True, "'Final answer:' stays officially but has no A-D"),
    ("`C`", True, True, "inline code"),
    ("__C__", True, True, "underscore emphasis"),
    ("[C]", True, True, "brackets: official first capital; robust letter standing alone"),
    ("B", False, False, "wrong letter"),
    ("The answer is B", False, False, "wrong letter with prefix"),
    ("**B**", False, False, "wrong letter in markdown"),
    ("a red thermos", False, False, "wrong option text"),
    ("D. nothing", False, False, "wrong option"),
    ("", False, False, "empty"),
    ("insufficient", False, False, "'insufficient' is wrong on an answerable task"),
    ("It is C or B", True, True, "first letter"),
    ("B or C", False, False, "first letter"),
    ("Cup", True, False, "'Cup' gives C officially; robust needs a letter standing alone"),
    ("the green one", False, False, "no option text matches exactly"),
    ("green cup", False, False, "a partial option text is no match in either mode"),
    ("C: a green cup", True, True, "letter with colon"),
    ("Answer: (C)", True, True, "prefix and parentheses"),
    ("The answer is (C) a green cup.", True, True, "full sentence"),
    ("E", False, False, "not an option"),
]


def _task(**kw):
    base = dict(id="t", question="q", answer="1987", answer_type="number")
    return Task(**{**base, **kw})


@pytest.mark.parametrize(("answer", "official", "robust", "rule"), EMBEDDED_MC, ids=[r[3] for r in EMBEDDED_MC])
def test_embedded_multiple_choice(answer, official, robust, rule):
    mc = _task(answer="C", answer_type="multiple_choice", options=WS_OPTIONS)
    assert judge_embedded(mc, answer, "official") is official
    assert judge_embedded(mc, answer, "robust") is robust
    assert judge_embedded(mc, answer) is robust  # the embedded world defaults to robust


def test_embedded_open_answers_follow_gaia_modes():
    t = _task(answer="1,000")
    assert judge_embedded(t, "1000") and not judge_embedded(t, "1000", "official")
    un = _task(answer="insufficient", answer_type="unanswerable")
    for mode in ("official", "robust"):
        assert judge_embedded(un, "Insufficient", mode) and not judge_embedded(un, "1987", mode)


def test_resolve_mode():
    assert resolve_mode(None, "embedded") == "robust"
    assert resolve_mode(None, "omnigaia") == "official" and resolve_mode(None, "worldsense") == "official"
    assert resolve_mode("robust", "omnigaia") == "robust"
    with pytest.raises(ValueError, match="scoring mode"):
        resolve_mode("lenient")


# ---------------------------------------------------------------------------------------------------------------------
# The OmniGAIA LLM judge against a fake loopback endpoint
# ---------------------------------------------------------------------------------------------------------------------


def _length_reply(content: str):
    from tests.fakes import Reply

    body = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 16, "total_tokens": 26},
    }
    return Reply(status=200, raw_body=json.dumps(body))


def _judge_against(*replies, pred="<answer>nineteen sixty-two</answer>", gold="1962", mode="official"):
    from collect.config import EndpointConfig
    from collect.llm import ChatClient
    from tests.fakes import FakeChatServer

    with FakeChatServer() as srv:
        srv.script("default", *replies)
        cfg = EndpointConfig(base_url=srv.base_url, model="judge", max_retries=0, backoff_base_s=0.01)

        async def go():
            client = ChatClient(cfg)
            try:
                return await omnigaia_judge("When?", pred, gold, client, "judge", mode)
            finally:
                await client.close()

        res = asyncio.run(go())
        return res, [b for _, b in srv.requests], srv.pending("default")


def test_llm_judge_proper_replies_and_official_request():
    from tests.fakes import text

    res, reqs, _ = _judge_against(text("Correct"))
    assert res.correct is True and res.method == "llm" and res.mode == "official"
    body = reqs[0]
    assert body["max_tokens"] == JUDGE_MAX_TOKENS == 40960
    assert (
        body["chat_template_kwargs"]["enable_thinking"] is False and body["chat_template_kwargs"]["thinking"] is False
    )
    prompt = body["messages"][0]["content"]
    assert prompt.startswith("Please determine if the model correctly predicted the answer.\nQuestion: When?\n")
    assert "Model Predicted Answer: nineteen sixty-two\nLabeled Answer: 1962\n" in prompt
    assert prompt.endswith("otherwise return 'Incorrect'. Provide only this single word response.")
    res, reqs, _ = _judge_against(text("Incorrect"))
    assert res.correct is False and res.method == "llm" and len(reqs) == 1


def test_llm_judge_thinking_reply_uses_text_after_think():
    from tests.fakes import text

    res, reqs, _ = _judge_against(
        text("<think>The labeled answer is 1962; Incorrect? No, same year.</think>\nCorrect")
    )
    assert res.correct is True and len(reqs) == 1


@pytest.mark.parametrize(
    "bad",
    ["truncated", "empty", "verdictless", "unclosed_think"],
)
def test_llm_judge_failed_replies_are_retried_then_unjudged(bad):
    from tests.fakes import empty, text

    make = {
        "truncated": lambda: _length_reply("<think>The labeled answer is 1962 but"),
        "empty": lambda: empty(),
        "verdictless": lambda: text("Yes"),
        "unclosed_think": lambda: text("<think>The labeled answer is 1962 but"),
    }[bad]
    res, reqs, left = _judge_against(make(), make(), make())
    assert res.correct is None and res.method == "unjudged" and "judge failed" in res.detail
    assert len(reqs) == 3 and left == 0  # JUDGE_ATTEMPTS tries, never a pass
    # a failure followed by a proper verdict is that verdict
    res, reqs, _ = _judge_against(make(), text("Incorrect"))
    assert res.correct is False and res.method == "llm" and len(reqs) == 2


def test_llm_judge_endpoint_errors_are_unjudged():
    from tests.fakes import fault_500

    res, reqs, _ = _judge_against(fault_500(), fault_500(), fault_500())
    assert res.correct is None and res.method == "unjudged" and "error server_error" in res.detail


def test_llm_judge_not_called_on_em_or_empty_prediction():
    res, reqs, _ = _judge_against(pred="<answer> 1962 </answer>")
    assert res.correct is True and res.method == "em" and reqs == []
    res, reqs, _ = _judge_against(pred="<answer></answer>")
    assert res.correct is False and res.method == "em" and reqs == []


def test_llm_judge_case_sensitive_tag_officially():
    """<ANSWER> is no tag officially: the last 20 words go to the judge; robust extracts the block and EM decides."""
    from tests.fakes import text

    res, reqs, _ = _judge_against(text("Incorrect"), pred="So: <ANSWER>1962</ANSWER>")
    assert res.correct is False and res.extracted == "So: <ANSWER>1962</ANSWER>" and len(reqs) == 1
    res, reqs, _ = _judge_against(pred="So: <ANSWER>1962</ANSWER>", mode="robust")
    assert res.correct is True and res.method == "em" and reqs == []


# ---------------------------------------------------------------------------------------------------------------------
# The run's judge call site, the summary and the report carry the mode and the unjudged tasks
# ---------------------------------------------------------------------------------------------------------------------


def test_run_judge_call_site_modes_and_unjudged():
    from collect.config import CollectConfig, EndpointConfig
    from collect.llm import ClientPool
    from collect.run import judge_answer
    from tests.fakes import FakeChatServer, text

    with FakeChatServer() as srv:
        srv.script("default", text("Yes"), text("Yes"), text("Yes"), text("Correct"))
        ep = EndpointConfig(base_url=srv.base_url, model="judge", max_retries=0)
        task = _task(answer="1962", source="omnigaia")

        async def go(scoring):
            cfg = CollectConfig(endpoints={"j": ep}, judge={"endpoint": "j", **scoring})
            pool = ClientPool(cfg.endpoints)
            try:
                return await judge_answer(cfg, task, "<answer>MCMLXII</answer>", pool)
            finally:
                await pool.close()

        correct, info = asyncio.run(go({}))
        assert correct is None and info["method"] == "unjudged" and info["mode"] == "official" and info["detail"]
        correct, info = asyncio.run(go({"scoring": "robust", "max_tokens": 64}))
        assert correct is True and info == {"method": "llm", "mode": "robust"}
        assert srv.requests[-1][1]["max_tokens"] == 64
    ws = _task(answer="C", answer_type="multiple_choice", options=WS_OPTIONS, source="worldsense")
    assert asyncio.run(judge_answer(CollectConfig(), ws, "Definitely C", None)) == (
        False,
        {"method": "worldsense_option", "mode": "official"},
    )
    emb = _task(answer="C", answer_type="multiple_choice", options=WS_OPTIONS)
    assert asyncio.run(judge_answer(CollectConfig(), emb, "**C**", None)) == (
        True,
        {"method": "embedded", "mode": "robust"},
    )


def test_summary_and_report_show_mode_and_unjudged():
    from collect.summary import summarize
    from pipeline.report import render_report

    recs = [
        {"task_id": "a", "correct": True, "judge": {"method": "em", "mode": "official"}},
        {"task_id": "b", "correct": None, "judge": {"method": "unjudged", "mode": "official"}},
        {"task_id": "c", "correct": False, "judge": {"method": "llm", "mode": "official"}},
    ]
    s = summarize(recs)
    assert s["scoring_mode"] == "official" and s["n_unjudged"] == 1 and s["unjudged_tasks"] == ["b"]
    assert s["n_judged"] == 2 and s["accuracy"] == 0.5
    mixed = summarize(recs + [{"task_id": "d", "correct": True, "judge": {"method": "embedded", "mode": "robust"}}])
    assert mixed["scoring_mode"] == "mixed"
    assert summarize([{"task_id": "x", "correct": True}])["scoring_mode"] is None  # older records: unrecorded
    html = render_report("t", {"cell": s}, {"cell": []})
    assert "<th>scoring</th><th>unjudged</th>" in html and "<td>official</td><td>1</td>" in html
