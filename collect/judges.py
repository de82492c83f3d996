"""Answer judges: GAIA quasi-exact match, the OmniGAIA protocol (answer extraction, EM, then an optional LLM judge),
WorldSense option extraction, and the embedded world's judge.

Every scorer has two modes (`MODES`):

``official`` reproduces the reference scorer's verdicts, quirks included (the default for the real benchmarks):
  * GAIA quasi-exact match = the GAIA leaderboard's ``question_scorer``:
    - a gold that ``float()`` accepts is a number; the answer loses every ``$ % ,`` and must ``float()`` to exactly the
      same value (no tolerance); an answer that does not parse becomes ``inf``, so it *equals* a gold ``"inf"``;
      a gold ``"nan"`` never matches; ``float()`` also accepts ``"1e3"``, ``"1_000"`` and surrounding whitespace;
    - otherwise a gold holding ``,`` or ``;`` is a list, **including a thousands comma** (gold ``"1,000"`` is the list
      ``["1", "000"]``: answer ``"1000"`` is wrong, ``"1,000"`` and ``"1;0"`` are right); both sides split on
      ``[,;]``, lengths must agree, a numeric gold element compares as a number (above), any other element compares
      lowercased without whitespace **but with its punctuation** (``"St. Louis"`` != ``"St Louis"``);
    - otherwise strings compare lowercased without any whitespace and without ASCII punctuation, so a percent gold
      ``"50%"`` is the string ``"50"`` (answer ``"50"`` right, ``"50.0"`` and ``"0.5"`` wrong);
    - a missing answer (None) is the string ``"None"`` (it matches a gold ``"none"``).
  * OmniGAIA (``src/run_base_agent.py`` extraction, ``src/evaluate/eval_results.py`` scoring):
    - the answer is the last ``<answer>(.*?)</answer>`` match, case-sensitive (``<ANSWER>`` is not a tag), searched in
      the whole output including any ``<think>`` block, non-greedy from the first ``<answer>`` (so
      ``"<answer>a <answer>b</answer>"`` gives ``"a <answer>b"``), stripped; without a match, the last 20
      whitespace-separated words of the output;
    - EM: lowercase, whitespace collapsed; an empty extracted answer scores 0 (even against an empty gold);
    - the LLM judge (official prompt, ``max_tokens=40960``, thinking disabled through ``chat_template_kwargs``) is
      asked only when EM fails; its reply after the last ``</think>`` (lower case, as the reference splits) is a pass
      unless it contains ``Incorrect`` (case-sensitive: ``"incorrect"`` passes, ``"Correct, not Incorrect"`` fails);
      a closed block in another case (``<THINK>...</THINK>``) is not split off, so the whole reply is read.
    Deliberate exception, in both modes: an empty reply, a truncated one (``finish_reason == "length"``), an unclosed
    ``<think>`` (in any case; ``<THINK>...</THINK>`` is closed), or one with no ``correct``/``incorrect`` word
    (official: and no ``Incorrect``, which still fails) is a judge failure, and so is a request that raises (the
    project's ``ChatError`` or any exception of another client, e.g. a connection error of a plain OpenAI client):
    retried ``JUDGE_ATTEMPTS`` times in all, then *unjudged* (``correct=None``, counted and reported by the summary,
    left out of the accuracy); the judge never raises. The reference code scores such a reply correct (and a request
    that fails three times incorrect). We also send ``temperature=0``.
  * WorldSense = VLMEvalKit ``extract_characters_regex`` then ``score = (extracted == answer)``:
    - the prefixes are deleted everywhere in the reply, case-sensitive, in the reference's order; two of its entries
      lack a comma in the source, so ``"The best option is"``, ``"The correct option is"``, ``"Best answer:"`` and
      ``"Best option:"`` are never deleted on their own;
    - more than 10 words and no ``[ABCD]`` -> unanswered; else the first capital A-D *anywhere*, even inside a word
      (``"Definitely C"`` -> ``D``; ``"Because ..."`` -> ``B``); lowercase letters never count.
    Not reproduced: when the regex finds nothing VLMEvalKit asks a judge model (or its exact-matching fallback) to map
    the reply onto an option; here such a reply is unanswered (scores 0).
  * The embedded judge's multiple choice uses the WorldSense official extraction; open answers use GAIA official.

``robust`` is where the project deliberately differs (the default for the embedded world):
  * GAIA: a gold written as a number with thousands commas, a currency sign or a percent sign (``"1,000"``,
    ``"$1,250.50"``, ``"12.5%"``) is a number, not a list or a string; numbers compare with a relative tolerance of
    1e-9 (float rounding); only finite golds are numbers (``"inf"``/``"nan"`` compare as strings); list elements
    compare like single answers (punctuation dropped, numbers as numbers); a missing answer is wrong.
  * OmniGAIA: ``<think>`` blocks are removed before extraction; ``<answer>`` is matched case-insensitively and the
    last *innermost* block is taken; EM also accepts a robust GAIA quasi-exact match; the judge's verdict is the
    word ``correct``/``incorrect`` in any case (``"not correct"`` and ``"incorrect"`` fail).
  * WorldSense: markdown (``* _ `` ` ``) is dropped; prefixes (``answer:``, ``the answer is``, ``option`` ...) are
    stripped only at the start, case-insensitively; the choice is a letter that stands alone (``"Definitely C"`` ->
    ``C``); with options given, a reply equal to one option's text, or containing exactly one option's text, picks
    it before any letter search (``"A man holds a red thermos"`` -> the thermos option); otherwise a capital ``A``
    used as an article still counts as option A.
  * Embedded multiple choice: like WorldSense robust, for the letters of the task's options, plus a full-match of an
    option's text; so ``"The answer is C"``, ``"Answer: C"``, ``"**C**"``, ``"b)"`` and ``"a red thermos"`` all count.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass

from collect.ledger import INSUFFICIENT
from collect.llm import ChatError
from collect.values import same_value

MODES = ("official", "robust")
OMNIGAIA_JUDGE_PROMPT = (
    "Please determine if the model correctly predicted the answer.\n"
    "Question: {question}\n"
    "Model Predicted Answer: {predicted}\n"
    "Labeled Answer: {standard}\n"
    "Return 'Correct' if the model's prediction is completely accurate, otherwise return 'Incorrect'. "
    "Provide only this single word response."
)
# The official judge call: a large budget (eval_results.py: max_tokens=40960) with thinking disabled. The reference
# passes {"thinking": False} (DeepSeek-style templates); Qwen3-style templates read "enable_thinking". Unknown template
# kwargs are ignored by chat templates, so both are sent.
JUDGE_MAX_TOKENS = 40960
JUDGE_EXTRA_BODY = {"chat_template_kwargs": {"enable_thinking": False, "thinking": False}}
JUDGE_ATTEMPTS = 3  # the reference's MAX_RETRIES


@dataclass(frozen=True)
class JudgeResult:
    correct: bool | None  # None: unjudged (the LLM judge failed on every attempt)
    method: str  # "em" (exact match decided), "llm" (judge decided), "em_only" (no judge), "unjudged"
    extracted: str
    detail: str = ""
    mode: str = "official"


def resolve_mode(mode: str | None, source: str | None = None) -> str:
    """The scoring mode for a task source: an explicit mode, else official for real benchmarks, robust for the
    embedded world."""
    if mode is None:
        return "robust" if (source or "embedded") == "embedded" else "official"
    if mode not in MODES:
        raise ValueError(f"scoring mode must be one of {MODES}, got {mode!r}")
    return mode


# ---------------------------------------------------------------------------------------------------------------------
# GAIA quasi-exact match
# ---------------------------------------------------------------------------------------------------------------------


def _floatable(s: str) -> bool:
    try:
        float(s)
    except (TypeError, ValueError):
        return False
    return True


def _number_or_inf(s: str) -> float:
    """The reference's answer-side number: drop $ % , and float(), inf when that fails."""
    t = s
    for ch in "$%,":
        t = t.replace(ch, "")
    try:
        return float(t)
    except ValueError:
        return math.inf


_PUNCT = str.maketrans("", "", string.punctuation)


def _squash(s: str, drop_punct: bool = True) -> str:
    """No whitespace at all, lowercase, optionally without ASCII punctuation."""
    t = re.sub(r"\s", "", s).lower()
    return t.translate(_PUNCT) if drop_punct else t


def _gaia_official(pred: str | None, gold: str) -> bool:
    pred = "None" if pred is None else str(pred)
    gold = str(gold)
    if _floatable(gold):
        return _number_or_inf(pred) == float(gold)
    if "," in gold or ";" in gold:
        g_items, p_items = re.split(r"[,;]", gold), re.split(r"[,;]", pred)
        if len(g_items) != len(p_items):
            return False
        return all(
            (_number_or_inf(p) == float(g)) if _floatable(g) else _squash(p, False) == _squash(g, False)
            for p, g in zip(p_items, g_items, strict=True)
        )
    return _squash(pred) == _squash(gold)


_NUMBER_LIKE = re.compile(r"[-+]?[$€£]?\s*[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?\s*%?")


def _robust_number(s: str) -> float | None:
    """A finite number written plainly or with $/%/thousands commas; None otherwise."""
    t = s.strip()
    if not t or not re.search(r"\d", t):
        return None
    if _NUMBER_LIKE.fullmatch(t) is None and not _floatable(t):
        return None
    t = re.sub(r"[\s$€£%,]", "", t)
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _robust_answer_number(s: str) -> float | None:
    t = re.sub(r"[\s$€£%,]", "", s)
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _gaia_robust(pred: str | None, gold: str) -> bool:
    if pred is None:
        return False
    pred, gold = str(pred), str(gold)
    g_num = _robust_number(gold)
    if g_num is not None:
        p_num = _robust_answer_number(pred)
        return p_num is not None and abs(p_num - g_num) <= 1e-9 * max(1.0, abs(g_num))
    if same_value(pred, gold):  # the same day or quantity written another way ("the 3rd of May, 1921" = "3 May 1921")
        return True
    if "," in gold or ";" in gold:
        g_items, p_items = re.split(r"[,;]", gold), re.split(r"[,;]", pred)
        if len(g_items) != len(p_items):
            return False
        return all(_gaia_robust(p, g) for p, g in zip(p_items, g_items, strict=True))
    return _squash(pred) == _squash(gold)


def gaia_quasi_exact(pred: str | None, gold: str, mode: str = "official") -> bool:
    """GAIA quasi-exact match (see the module docstring for the two modes)."""
    return _gaia_official(pred, gold) if resolve_mode(mode) == "official" else _gaia_robust(pred, gold)


# ---------------------------------------------------------------------------------------------------------------------
# OmniGAIA
# ---------------------------------------------------------------------------------------------------------------------

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def extract_answer(text: str | None, mode: str = "official") -> str:
    """The OmniGAIA answer: the last <answer>...</answer> block, else the last 20 words."""
    if not text:
        return ""
    if resolve_mode(mode) == "official":
        blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
        return blocks[-1].strip() if blocks else " ".join(text.split()[-20:])
    body = _THINK_BLOCK.sub(" ", text)
    body = re.sub(r"<think>.*\Z", " ", body, flags=re.DOTALL | re.IGNORECASE)  # an unclosed think runs to the end
    blocks = re.findall(r"<answer>((?:(?!<answer>).)*?)</answer>", body, re.DOTALL | re.IGNORECASE)
    return blocks[-1].strip() if blocks else " ".join(body.split()[-20:])


def omnigaia_em(pred: str, gold: str, mode: str = "official") -> bool:
    """OmniGAIA exact match on an extracted answer: lowercase, whitespace collapsed (robust: or GAIA quasi-exact)."""
    if not pred:
        return False
    same = " ".join(str(pred).lower().split()) == " ".join(str(gold or "").lower().split())
    return same or (resolve_mode(mode) == "robust" and _gaia_robust(pred, str(gold or "")))


def parse_judge_reply(content: str | None, finish_reason: str | None, mode: str = "official") -> bool | None:
    """The judge's verdict, or None when the reply is not a usable verdict (empty, truncated, an unclosed <think>, no
    correct/incorrect word): a judge failure, never a pass."""
    if finish_reason == "length" or not content:
        return None
    official = resolve_mode(mode) == "official"
    closings = list(re.finditer(r"</think>", content, re.IGNORECASE))
    if not closings and re.search(r"<think>", content, re.IGNORECASE):
        return None  # an unclosed think block (in any case): the reply ended inside the reasoning
    if official and "</think>" in content:
        content = content.split("</think>")[-1]  # the reference splits on the lower-case tag only
    elif not official and closings:
        content = content[closings[-1].end() :]
    content = content.strip()
    if official and "Incorrect" in content:  # the reference's only failing rule (never a pass, so kept as is)
        return False
    if not content or not re.search(r"\b(in)?correct\b", content, re.IGNORECASE):
        return None
    if official:
        return True
    return not re.search(r"\bincorrect\b|\bnot\s+correct\b", content, re.IGNORECASE)


async def _ask_judge(client, model: str | None, messages: list[dict], max_tokens: int) -> tuple[str, str | None]:
    """(content, finish_reason) of one judge call, through collect.llm.ChatClient or a plain openai.AsyncOpenAI."""
    if hasattr(client, "chat") and callable(client.chat):  # collect.llm.ChatClient (retries, usage, faults)
        resp = await client.chat(messages, temperature=0.0, max_tokens=max_tokens, extra_body=JUDGE_EXTRA_BODY)
        return resp.text or "", resp.finish_reason
    resp = await client.chat.completions.create(
        model=model, messages=messages, temperature=0.0, max_tokens=max_tokens, extra_body=JUDGE_EXTRA_BODY
    )
    if not resp.choices:
        return "", None
    choice = resp.choices[0]
    return (choice.message.content or ""), getattr(choice, "finish_reason", None)


async def omnigaia_judge(
    question: str,
    pred: str | None,
    gold: str,
    client=None,
    model: str | None = None,
    mode: str = "official",
    max_tokens: int = JUDGE_MAX_TOKENS,
    attempts: int = JUDGE_ATTEMPTS,
) -> JudgeResult:
    """OmniGAIA scoring: EM on the extracted answer; only when that fails, the prediction is non-empty and a client is
    configured, the LLM judge (official prompt and budget, thinking disabled). A judge that gives no usable verdict
    in `attempts` tries leaves the task unjudged (correct=None)."""
    mode = resolve_mode(mode)
    extracted = extract_answer(pred, mode)
    if not extracted:
        return JudgeResult(False, "em", extracted, "empty prediction", mode)
    if omnigaia_em(extracted, gold, mode):
        return JudgeResult(True, "em", extracted, "", mode)
    if client is None or not model:
        return JudgeResult(False, "em_only", extracted, "exact match failed; no judge configured", mode)
    prompt = OMNIGAIA_JUDGE_PROMPT.format(question=question, predicted=extracted, standard=gold)
    messages = [{"role": "user", "content": prompt}]
    failures = []
    for _ in range(max(1, attempts)):
        try:
            content, finish = await _ask_judge(client, model, messages, max_tokens)
        except ChatError as e:
            failures.append(f"error {e.kind}: {e.detail[:160]}")  # the server's own message (redacted)
            continue
        except Exception as e:  # noqa: BLE001 - any client (a plain OpenAI client raises its own errors): unjudged
            failures.append(f"error {type(e).__name__}: {str(e)[:80]}")
            continue
        content = content if isinstance(content, str) else ""  # a reply whose content is not text: no verdict
        verdict = parse_judge_reply(content, finish, mode)
        if verdict is not None:
            return JudgeResult(verdict, "llm", extracted, content.strip()[-200:], mode)
        why = "truncated" if finish == "length" else ("empty" if not content.strip() else "no verdict")
        failures.append(f"{why}: {content.strip()[-80:]!r}")
    return JudgeResult(None, "unjudged", extracted, "judge failed: " + " | ".join(failures)[:300], mode)


# ---------------------------------------------------------------------------------------------------------------------
# WorldSense and multiple choice
# ---------------------------------------------------------------------------------------------------------------------

# VLMEvalKit's list, including its two missing commas (adjacent literals concatenate).
_WS_OFFICIAL_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",  # two entries joined by the missing comma
    "Best answer:Best option:",  # likewise
    "Answer:",
    "Option:",
)
_ROBUST_PREFIX = re.compile(
    r"^\s*(?:(?:the\s+)?(?:best|correct|final)?\s*(?:answer|option|choice)\s*(?:is)?\s*:?|i\s+(?:choose|pick|select))\s*",
    re.IGNORECASE,
)


def _ws_official(text: str) -> str:
    s = text.strip()
    for p in _WS_OFFICIAL_PREFIXES:
        s = s.replace(p, "")
    if len(s.split()) > 10 and not re.search("[ABCD]", s):
        return ""
    m = re.search("[ABCD]", s)
    return m.group(0) if m else ""


def _option_text(opt: str) -> str:
    return re.sub(r"^\s*\(?[A-Z]\)?[.):]\s*", "", opt)


def _robust_letter(text: str, letters: str, options: list[str] | None = None) -> str | None:
    s = re.sub(r"[*_`]", "", text).strip()
    while True:
        m = _ROBUST_PREFIX.match(s)
        if not m or not m.group(0).strip():
            break
        s = s[m.end() :].strip()
    cls = f"[{letters}]"
    m = re.fullmatch(rf"\(?({cls})\)?[.):]?", s, re.IGNORECASE)  # a lone letter, any case: "c", "(B)", "b)"
    if m:
        return m.group(1).upper()
    m = re.match(rf"\(?({cls})(?:\)|[.:])(?:\s|$)", s)  # "C. a red thermos", "(B) the red one"
    if m:
        return m.group(1)
    if options:
        norm = _squash(s)
        for i, opt in enumerate(options):
            if norm and _squash(_option_text(opt)) == norm:
                return letters[i] if i < len(letters) else None
        texts = [_squash(_option_text(opt)) for opt in options]
        hits = [i for i, t in enumerate(texts) if t and t in norm]
        if len(hits) == 1 and hits[0] < len(letters):
            return letters[hits[0]]
    m = re.search(rf"(?<![A-Za-z])({cls})(?![A-Za-z])", s)  # else the first capital letter standing alone
    return m.group(1) if m else None


def worldsense_extract(text: str | None, mode: str = "official", options: list[str] | None = None) -> str | None:
    """The chosen option letter of a WorldSense reply, None when unanswered (see the module docstring)."""
    if text is None:
        return None
    if resolve_mode(mode) == "official":
        return _ws_official(str(text)) or None
    return _robust_letter(str(text), "ABCD", options)


def worldsense_correct(text: str | None, gold: str, mode: str = "official", options: list[str] | None = None) -> bool:
    choice = worldsense_extract(text, mode, options)
    return choice is not None and choice == str(gold).strip()


def _mc_letter(answer: str, options: list[str], mode: str) -> str | None:
    if mode == "official":
        return _ws_official(answer) or None
    letters = "ABCDEFGH"[: max(len(options), 4)]
    return _robust_letter(answer, letters, options)


def judge_embedded(task, answer: str | None, mode: str = "robust") -> bool:
    """Embedded world judge: 'insufficient' is correct exactly on unanswerable tasks; multiple choice matches the
    option letter (robust: or the option text); open answers use GAIA quasi-exact match."""
    mode = resolve_mode(mode)
    if answer is None:
        return False
    ans = str(answer).strip()
    is_insufficient = _squash(ans) == INSUFFICIENT
    if task.answer_type == "unanswerable" or _squash(task.answer) == INSUFFICIENT:
        return is_insufficient
    if is_insufficient:
        return False
    if task.answer_type == "multiple_choice" or task.options:
        return _mc_letter(ans, list(task.options or []), mode) == task.answer.strip().upper()
    return gaia_quasi_exact(ans, task.answer, mode)
