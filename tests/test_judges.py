"""Judges on literal cases."""

from __future__ import annotations

import asyncio

from collect.judges import extract_answer, gaia_quasi_exact, judge_embedded, omnigaia_judge, worldsense_extract
from collect.tasks import Task


def test_gaia_quasi_exact_numbers_lists_strings():
    assert gaia_quasi_exact("$1,250", "1250")
    assert gaia_quasi_exact("790.0", "790")
    assert not gaia_quasi_exact("791", "790")
    assert not gaia_quasi_exact("about 790", "790")
    assert gaia_quasi_exact("Paris; Rome", "paris, rome")
    assert not gaia_quasi_exact("Paris", "paris, rome")
    assert gaia_quasi_exact("The Quillwater Six!", "the quillwater six")
    assert not gaia_quasi_exact(None, "x")


def test_extract_answer_last_block_else_last_20_words():
    assert extract_answer("x <answer>a</answer> y <answer> b </answer>") == "b"
    words = " ".join(f"w{i}" for i in range(30))
    assert extract_answer(words) == " ".join(f"w{i}" for i in range(10, 30))
    assert extract_answer("") == ""


class _FakeClient:
    """Scripted judge client with the openai client's call shape."""

    def __init__(self, reply):
        self.reply, self.prompts = reply, []
        self.chat = self
        self.completions = self

    async def create(self, model, messages, **kw):
        self.prompts.append(messages[0]["content"])
        msg = type("M", (), {"content": self.reply})
        return type("R", (), {"choices": [type("C", (), {"message": msg})]})


def test_omnigaia_judge_em_then_llm_rules():
    run = asyncio.run
    r = run(omnigaia_judge("q", "so <answer>  790 </answer>", "790"))
    assert r.correct and r.method == "em"
    r = run(omnigaia_judge("q", "<answer>seven hundred ninety</answer>", "790"))
    assert not r.correct and r.method == "em_only"
    r = run(omnigaia_judge("q", "", "790", client=_FakeClient("Correct"), model="m"))
    assert not r.correct and r.method == "em"
    c = _FakeClient("<think>maybe Incorrect?</think> Correct")
    r = run(omnigaia_judge("How many?", "<answer>seven hundred ninety</answer>", "790", client=c, model="m"))
    assert r.correct and r.method == "llm"
    assert "Model Predicted Answer: seven hundred ninety" in c.prompts[0] and "Labeled Answer: 790" in c.prompts[0]
    r = run(omnigaia_judge("q", "<answer>800</answer>", "790", client=_FakeClient("Incorrect"), model="m"))
    assert not r.correct and r.method == "llm"


def test_worldsense_extract():
    assert worldsense_extract("The best answer is B") == "B"
    assert worldsense_extract("Answer: (C) the red one") == "C"
    assert worldsense_extract("D") == "D"
    assert worldsense_extract("I think the person is probably holding something but it is hard to tell here") is None
    assert worldsense_extract("") is None


def _task(**kw):
    base = dict(id="t", question="q", answer="1987", answer_type="number")
    return Task(**{**base, **kw})


def test_judge_embedded_open_mc_unanswerable():
    assert judge_embedded(_task(), "1,987")
    assert not judge_embedded(_task(), "insufficient")
    mc = _task(answer="B", answer_type="multiple_choice", options=["A. a rope", "B. a red thermos", "C. x", "D. y"])
    assert judge_embedded(mc, "B") and judge_embedded(mc, "b)") and judge_embedded(mc, "a red thermos")
    assert not judge_embedded(mc, "A") and not judge_embedded(mc, "a rope")
    un = _task(answer="insufficient", answer_type="unanswerable")
    assert judge_embedded(un, "Insufficient") and not judge_embedded(un, "1987") and not judge_embedded(un, None)
