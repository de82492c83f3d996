"""Score only the labelled positions through TRL's fused LM head on CPU.

TRL (1.16) trains SFT and GRPO through a fused LM head (`trl.trainer.utils.add_fused_lm_head`): the backbone runs,
then the LM head and the log-softmax are applied in tiles to the positions that carry a label. On CUDA/XPU it gathers
those positions first ("compact"); on every other device it scores *every* position and masks afterwards, so that
the tile shapes stay fixed for compilers such as Neuron's. On CPU nothing is compiled, and state-SFT rows are long
prompts with short actions (about 770 prompt tokens for 30 action tokens on the embedded world), so most of that
work is thrown away: the tiny recipe spent about half of each step there.

`compact_lm_head_on_cpu()` makes the compact path apply to CPU too. The loss, the gradients and the logged metrics
are the same (tests/test_sft.py checks loss and gradients against the uncompacted head); the step is about twice as
fast on the tiny recipe. Nothing changes on GPU. If a TRL version no longer has the hook, it logs that and leaves
TRL as it is.

`expose_thinker_backbone()` gives the fused head the Qwen3-Omni thinker's backbone under transformers 5.17 (the GPU
stack's), where `model.base_model` is the thinker itself (ThinkerTextBackbone says why); under 5.24 it changes nothing.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def compact_lm_head_on_cpu() -> bool:
    """Let TRL's fused LM head gather the labelled positions on CPU as it does on CUDA. True when active."""
    try:
        from trl.trainer import utils as trl_utils
    except ImportError:  # pragma: no cover - trl is a hard dependency
        return False
    current = getattr(trl_utils, "_use_triton", None)
    if current is None:
        log.warning("trl.trainer.utils._use_triton not found: the fused LM head scores every position on CPU")
        return False
    if getattr(current, "_compact_on_cpu", False):
        return True

    def use_compact(device) -> bool:
        return device.type == "cpu" or current(device)

    use_compact._compact_on_cpu = True
    use_compact._original = current
    # only the fused head's compact/full choice reads this name; the kernel keeps its own Triton check
    trl_utils._use_triton = use_compact
    return True


def restore_lm_head() -> None:
    """Undo compact_lm_head_on_cpu (tests)."""
    from trl.trainer import utils as trl_utils

    current = trl_utils._use_triton
    if getattr(current, "_compact_on_cpu", False):
        trl_utils._use_triton = current._original


# what the thinker's own forward merges into the text embeddings; the text backbone below refuses them
THINKER_MEDIA_INPUTS = ("input_features", "pixel_values", "pixel_values_videos")


class ThinkerTextBackbone:
    """What TRL's fused LM head calls as `model.base_model` on a Qwen3-Omni thinker whose `base_model` is the model.

    TRL (1.16, `add_fused_lm_head`) runs `model.base_model(**inputs).last_hidden_state` and applies the LM head itself.
    transformers resolves `base_model` as `getattr(model, model.base_model_prefix, model)`. In transformers 5.24 the
    thinker's prefix is `model`, its multimodal backbone (Qwen3OmniMoeThinkerModel). In 5.17 (the GPU stack's, vLLM
    0.31's pin) the prefix is `thinker` (it strips the full Omni checkpoint's `thinker.` keys when loading) and the
    thinker has no such attribute, so `base_model` is the thinker itself and TRL gets its logits output, with no
    `last_hidden_state`. This object, set as that attribute, does what 5.17's thinker forward does for text rows
    before its LM head: embeddings, the thinker's position ids (`compute_3d_position_ids`), its text model
    (`model.model`). It is a plain object, not a module: state dict, saving, PEFT and DeepSpeed do not see it.
    Media inputs are refused (state-SFT rows are text; the thinker merges media before its text model)."""

    def __init__(self, thinker):
        self._thinker = thinker

    def __call__(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs):
        media = [k for k in THINKER_MEDIA_INPUTS if kwargs.get(k) is not None]
        if media:
            raise ValueError(
                f"sft/lm_head.py ThinkerTextBackbone: got {', '.join(media)}; the Qwen3-Omni thinker's text backbone "
                "takes text rows only (transformers < 5.18 has no multimodal thinker backbone for TRL's fused LM "
                "head). Train text prompt-completion rows, or media rows with transformers >= 5.18."
            )
        kwargs = {k: v for k, v in kwargs.items() if k not in THINKER_MEDIA_INPUTS}
        thinker = self._thinker
        if inputs_embeds is None:
            inputs_embeds = thinker.get_input_embeddings()(input_ids)
        if position_ids is None:
            position_ids = thinker.compute_3d_position_ids(
                input_ids=input_ids,
                image_grid_thw=None,
                video_grid_thw=None,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                past_key_values=kwargs.get("past_key_values"),
            )
        return thinker.model(
            attention_mask=attention_mask, position_ids=position_ids, inputs_embeds=inputs_embeds, **kwargs
        )


def expose_thinker_backbone(model) -> bool:
    """Give TRL's fused LM head the Qwen3-Omni thinker's backbone (ThinkerTextBackbone) where transformers'
    `base_model` is the thinker itself (5.17); where it already is a backbone (5.24), change nothing. True when set."""
    if model.base_model is not model:
        return False
    # object.__setattr__: a plain attribute, not registered as a submodule (nn.Module.__setattr__ would not register
    # a non-module either; this states it)
    object.__setattr__(model, model.base_model_prefix, ThinkerTextBackbone(model))
    if model.base_model is model:  # pragma: no cover - a prefix transformers does not resolve as an attribute
        raise RuntimeError(f"{type(model).__name__}: base_model_prefix {model.base_model_prefix!r} did not resolve")
    return True
