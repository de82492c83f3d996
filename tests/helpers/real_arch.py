"""Scaled-down real architectures for tests: a random-initialised Qwen3.5 in the layout of the real checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"


def _with_template(tok, name):
    tok.chat_template = (TEMPLATES / name).read_text()
    return tok


def _tiny_qwen3_5(out: Path, tok) -> Path:
    """The layout of the real Qwen3.5-27B checkpoint: Qwen3_5ForConditionalGeneration, text model under
    model.language_model, vision tower under model.visual; 4 text layers = the hybrid pattern (3 linear, 1 full)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  num_position_embeddings=16)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(
        Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    )
    assert model.config.text_config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    tok = _with_template(tok, "qwen3_5_think.jinja")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
