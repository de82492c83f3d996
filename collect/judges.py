"""Answer judges: GAIA quasi-exact match, the OmniGAIA protocol (EM then an optional LLM judge), WorldSense option
extraction, and the embedded world's judge."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

OMNIGAIA_JUDGE_PROMPT = (
    "Please determine if the model correctly predicted the answer.\n"
    "Question: {question}\n"
    "Model Predicted Answer: {predicted}\n"
    "Labeled Answer: {standard}\n"
    "Return 'Correct' if the model's prediction is completely accurate, otherwise return 'Incorrect'. "
    "Provide only this single word response."
)
INSUFFICIENT = "insufficient"


@dataclass(frozen=True)
class JudgeResult:
    correct: bool
    method: str  # "em" (exact match decided), "llm" (judge model decided), "em_only" (no judge configured)
    extracted: str
    detail: str = ""


def _to_float(s: str) -> float | None:
    t = s.strip()
    for ch in ("$", "%", ","):
        t = t.replace(ch, "")
    try:
        return float(t)
    except ValueError:
        return None


def _norm_str(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in string.punctuation)
    return re.sub(r"\s+", "", s)


def gaia_quasi_exact(pred: str | None, gold: str) -> bool:
    """GAIA scorer: numbers compare as floats (after stripping $ % ,), lists split on , or ; element-wise,
    strings compare lowercased without whitespace and punctuation."""
    if pred is None:
        return False
    pred, gold = str(pred), str(gold)
    g_num = _to_float(gold)
    if g_num is not None:
        p_num = _to_float(pred)
        return p_num is not None and abs(p_num - g_num) <= 1e-9 * max(1.0, abs(g_num))
    if any(c in gold for c in ",;"):
        g_items = [x for x in re.split(r"[,;]", gold)]
        p_items = [x for x in re.split(r"[,;]", pred)]
        if len(g_items) != len(p_items):
            return False
        return all(gaia_quasi_exact(p, g) for p, g in zip(p_items, g_items, strict=True))
    return _norm_str(pred) == _norm_str(gold)


def extract_answer(text: str | None) -> str:
    """The last <answer>...</answer> block, else the last 20 words (OmniGAIA protocol)."""
    if not text:
        return ""
    blocks = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE)
    if blocks:
        return blocks[-1].strip()
    return " ".join(text.split()[-20:])


def _em(pred: str, gold: str) -> bool:
    return re.sub(r"\s+", " ", pred.strip().lower()) == re.sub(r"\s+", " ", gold.strip().lower())


async def omnigaia_judge(
    question: str, pred: str | None, gold: str, client=None, model: str | None = None
) -> JudgeResult:
    """OmniGAIA scoring: exact match (lowercase, collapsed whitespace) on the extracted answer; only when that fails
    and the prediction is non-empty, and a client is configured, ask the LLM judge: correct unless its reply (after
    any </think>) contains 'Incorrect'."""
    extracted = extract_answer(pred)
    if not extracted:
        return JudgeResult(False, "em", extracted, "empty prediction")
    if _em(extracted, gold):
        return JudgeResult(True, "em", extracted)
    if client is None or not model:
        return JudgeResult(False, "em_only", extracted, "exact match failed; no judge configured")
    prompt = OMNIGAIA_JUDGE_PROMPT.format(question=question, predicted=extracted, standard=gold)
    messages = [{"role": "user", "content": prompt}]
    if hasattr(client, "chat") and callable(client.chat):  # collect.llm.ChatClient (retries, usage, faults)
        reply = (await client.chat(messages, temperature=0.0, max_tokens=16)).text
    else:  # a plain openai.AsyncOpenAI
        resp = await client.chat.completions.create(model=model, messages=messages, temperature=0.0, max_tokens=16)
        reply = (resp.choices[0].message.content or "") if resp.choices else ""
    if "</think>" in reply:
        reply = reply.split("</think>")[-1]
    return JudgeResult("Incorrect" not in reply, "llm", extracted, reply.strip()[:200])


_WS_PREFIXES = (
    "the best answer is",
    "the correct answer is",
    "the answer is",
    "answer:",
    "best answer:",
    "correct answer:",
    "option",
)


def worldsense_extract(text: str | None) -> str | None:
    """WorldSense option extraction: strip answer prefixes; unanswered when > 10 words with no A-D; else the first
    standalone A-D letter."""
    if text is None:
        return None
    s = text.strip()
    low = s.lower()
    changed = True
    while changed:
        changed = False
        for p in _WS_PREFIXES:
            if low.startswith(p):
                s = s[len(p) :].strip()
                low = s.lower()
                changed = True
    m = re.search(r"(?<![A-Za-z])([ABCD])(?![A-Za-z])", s)
    if len(s.split()) > 10 and m is None:
        return None
    return m.group(1) if m else None


def _mc_letter(answer: str, options: list[str]) -> str | None:
    a = answer.strip()
    m = re.fullmatch(r"\(?([A-Za-z])\)?[.)]?", a)
    if m:
        return m.group(1).upper()
    m = re.match(r"\(?([A-D])[.)]\s", a)
    if m:
        return m.group(1)
    for i, opt in enumerate(options):
        text = re.sub(r"^\s*[A-Z][.)]\s*", "", opt)
        if _norm_str(text) == _norm_str(a):
            return "ABCDEFGH"[i]
    return None


def judge_embedded(task, answer: str | None) -> bool:
    """Embedded world judge: 'insufficient' is correct exactly on unanswerable tasks; multiple choice matches the
    option (letter or option text); open answers use GAIA quasi-exact match."""
    if answer is None:
        return False
    ans = str(answer).strip()
    is_insufficient = _norm_str(ans) == INSUFFICIENT
    if task.answer_type == "unanswerable" or _norm_str(task.answer) == INSUFFICIENT:
        return is_insufficient
    if is_insufficient:
        return False
    if task.answer_type == "multiple_choice" or task.options:
        return _mc_letter(ans, task.options) == task.answer.strip().upper()
    return gaia_quasi_exact(ans, task.answer)
