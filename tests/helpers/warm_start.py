"""A stand-in for state-SFT in the GRPO tests (tests/test_rl.py, tests/test_rl_online.py): a few optimizer steps of a
small model on reference decisions, so the RL start policy already emits some parseable actions (else every reward
is equal and GRPO has no signal)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# The shortest decision states the runtime produces: the three decisions of the media multiple-choice and
# multi-asset tasks among the recorded teacher runs (tests/conftest.py), ~400-560 tokens each with the tiny tokenizer.
SHORT_FAMILIES = ("media_mc", "multi_asset")


def warm_start(base: Path, rows: list[dict], out: Path, steps: int = 60, lr: float = 3e-3, batch: int = 4) -> Path:
    """Full fine-tune of the checkpoint `base` on rl_states rows' reference decisions; saved (with its tokenizer) to
    `out`, which is returned."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collect.actions import Action

    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    seqs = []
    for r in rows:
        p = tok.apply_chat_template(
            r["prompt"], tools=json.loads(r["tools"]), add_generation_prompt=True, tokenize=False
        )
        c = Action(**json.loads(r["reference_action"])).to_text() + tok.eos_token
        seqs.append((tok(p, add_special_tokens=False)["input_ids"], tok(c, add_special_tokens=False)["input_ids"]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(0)
    model.train()
    for s in range(steps):
        b = [seqs[(s * batch + i) % len(seqs)] for i in range(batch)]
        n = max(len(p) + len(c) for p, c in b)
        ids = torch.full((batch, n), tok.pad_token_id)
        lab = torch.full((batch, n), -100)
        att = torch.zeros(batch, n, dtype=torch.long)
        for i, (p, c) in enumerate(b):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            att[i, : len(p) + len(c)] = 1
            lab[i, len(p) : len(p) + len(c)] = torch.tensor(c)
        model(input_ids=ids, attention_mask=att, labels=lab).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def finish_policy(work: Path, recorded_correct_runs: list[dict]) -> Path:
    """The GRPO tests' start policy, in `work`: a 2-layer, 64-wide tiny model (tokenizer trained on the recorded runs)
    warm-started on the finish decisions of the short recorded runs only. The runtime's prompts are 450-700 tokens,
    and in a CPU-test budget a tiny model learns the short, fixed finish call well enough that some, not all, sampled
    completions are valid (measured: 1 of 24 after 40 steps, more after 60), while the perception calls, which copy
    asset ids and queries from the prompt, stay out of reach."""
    from collect import teacher_runs
    from sft.tiny import build_tiny_model

    short = [r for r in recorded_correct_runs if r["task_meta"]["family"] in SHORT_FAMILIES]
    base = build_tiny_model(work / "small", texts=list(teacher_runs.texts(24)), seed=0, hidden_size=64, num_layers=2)
    finish = [r for r in teacher_runs.rl_rows(short) if json.loads(r["reference_action"])["name"] == "finish"]
    return warm_start(base, finish, work / "sft")
