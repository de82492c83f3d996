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
