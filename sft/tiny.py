"""A tiny Qwen3 planner model built offline: random weights + a byte-level BPE tokenizer trained on planner text.

Why: no hub access here, in CI or on lent GPU machines, yet tests and the CPU demo need a real causal LM with a
tool-calling chat template. The tokenizer is trained on the text the planner reads (ledger digests, tool schemas,
actions) so ~1-3k-char JSON prompts stay short in tokens.

Verified gotchas:
  * `<tool_call>`/`</tool_call>` are added tokens but NOT special: GRPO decodes with skip_special_tokens=True.
  * The assistant turn, including `<|im_end|>`, sits inside {% generation %} so assistant masks cover the stop token.
  * Tool calls render as the canonical `collect.actions.Action.to_text()` form.

    python -m sft.tiny --out runs/tiny/base [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from collect import teacher_runs
from collect.world import load_world

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML with a tools header. Assistant tool_calls render exactly as Action.to_text():
#   <tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>
# The row contract is the one of the real Qwen templates: ARGS is a mapping (collect.harvest.decision_completion)
# rendered with tojson (transformers' tojson = json.dumps(ensure_ascii=False): the same bytes as Action.to_text()).
# A JSON string (the OpenAI wire form a serve.local client may send back) is also accepted and rendered verbatim.
CHAT_TEMPLATE = r"""{%- if messages[0].role == 'system' %}
{%- set sys = messages[0].content %}{%- set msgs = messages[1:] %}
{%- else %}{%- set sys = '' %}{%- set msgs = messages %}{%- endif %}
{%- if tools %}
{{- '<|im_start|>system\n' + sys + '\n\n# Tools\n<tools>' }}
{%- for t in tools %}{{- '\n' + (t | tojson) }}{%- endfor %}
{{- '\n</tools>\nCall one tool as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n' }}
{%- elif sys %}{{- '<|im_start|>system\n' + sys + '<|im_end|>\n' }}{%- endif %}
{%- for m in msgs %}
{%- if m.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}
{%- generation %}
{%- if m.content %}{{- m.content }}{%- endif %}
{%- if m.tool_calls %}{%- for tc in m.tool_calls %}{%- set f = tc.function if tc.function else tc %}
{%- if (loop.first and m.content) or not loop.first %}{{- '\n' }}{%- endif %}
{{- '<tool_call>\n{"name": ' + (f.name | tojson) + ', "arguments": ' }}
{%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}{%- endif %}
{{- '<|im_end|>' }}
{%- endgeneration %}
{{- '\n' }}
{%- elif m.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"""


def default_texts(seed: int = 0) -> Iterable[str]:
    """What the planner reads and writes: the embedded world's texts (questions, tracks, web corpus), the role
    prompts, and the prompts, tool schemas and actions of recorded teacher runs of the real runtime on the first 24
    train tasks (collect.teacher_runs)."""
    prompts_dir = Path(__file__).resolve().parents[1] / "collect" / "roles" / "prompts"
    return itertools.chain(
        teacher_runs.texts(n=24, split="train"),
        (p.read_text(encoding="utf-8") for p in sorted(prompts_dir.glob("*.md"))),
        load_world(seed=seed).texts(),
    )


# Pre-tokenizer splits (BPE never merges across a split): only at line ends and before each ' "' / '{"', so BPE
# learns whole keys and phrases ('"need_index": ', 'name of the ') and prompts stay short.
PRETOKENIZER_SPLITS = [(r"\n", "merged_with_previous"), (r' "|\{"', "merged_with_next")]


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096):
    """Byte-level BPE trained on `texts`, wrapped as a transformers fast tokenizer with the ChatML template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Planner prompts are indented JSON. GPT-2's regex pre-split ('"', 'need', '_', 'index', '":') costs ~4x more
    # tokens than these splits; digits stay single either way.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(rx), behavior=b) for rx, b in PRETOKENIZER_SPLITS]
        + [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    # the template's own fixed strings are part of every prompt
    header = ["# Tools\n<tools>\n</tools>\nCall one tool as", '{"name": ..., "arguments": {...}}', "system user"]
    tok.train_from_iterator(itertools.chain(header * 50, texts), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.model_max_length = 4096
    return hf_tok


def save_checkpoint(model, tok, out: Path) -> None:
    """A randomly initialised model + local tokenizer as a checkpoint directory: generation stops at the tokenizer's
    end-of-turn token and pads with its pad token (no BOS), as every tiny and gpu-check model here does."""
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def build_tiny_model(
    out_dir: str | os.PathLike,
    texts: Iterable[str] | None = None,
    seed: int = 0,
    vocab_size: int = 4096,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    intermediate_size: int = 384,
    max_position_embeddings: int = 4096,
) -> Path:
    """Train the tokenizer, build a random Qwen3ForCausalLM (weights deterministic by `seed`), save both to out_dir."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    t0 = time.time()
    texts = default_texts(seed) if texts is None else texts
    tok = train_tokenizer(texts, vocab_size=vocab_size)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    save_checkpoint(model, tok, out)
    n = sum(p.numel() for p in model.parameters())
    log.info("tiny model: %.2fM params, vocab %d, built in %.1fs -> %s", n / 1e6, len(tok), time.time() - t0, out)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="build the tiny offline Qwen3 planner model")
    ap.add_argument("--out", required=True, help="output directory (save_pretrained layout)")
    ap.add_argument("--seed", type=int, default=0, help="weight init seed (and world seed of the tokenizer text)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.time()
    path = build_tiny_model(a.out, seed=a.seed, vocab_size=a.vocab_size)
    print(f"tiny model written to {path} in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
