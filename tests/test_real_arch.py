"""The GPU SFT recipes on scaled-down real architectures, through sft.train's entry point, on CPU.

Random-initialised Qwen3.5 (the vision-language checkpoint layout, hybrid text model: 3 linear-attention layers then
1 full-attention layer) and Qwen3-Omni thinker (MoE text model + audio and vision towers) are built from configs
(nothing downloaded). Each recipe runs with only its GPU-only settings overridden on the command line (bf16 off,
dtype float32, no flash attention, model path, 1 step); then: where LoRA landed, one step, one eval pass, the merged
checkpoint and the adapter in the layout vLLM loads, reload, generate.

The vLLM expectations below are data copied from vLLM's source (read at the commits named), not imported: vLLM is not
installed on CPU machines. What they cannot show (a real vLLM load) is listed in docs/gpu.md.
"""

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from collect import teacher_runs
from collect.harvest import harvest
from sft.tiny import train_tokenizer
from sft.train import checkpoint_keys, main, parse_args
from tests.helpers.real_arch import _tiny_qwen3_5, _with_template

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "fixtures" / "chat_templates"

# vLLM, vllm/model_executor/models/qwen3_vl.py (Qwen3VLForConditionalGeneration.hf_to_vllm_mapper, inherited by
# Qwen3_5ForConditionalGeneration in vllm/model_executor/models/qwen3_5.py @ 00def4f8421153e037ff6270c0a8c31912a00206):
# checkpoint name prefix -> vLLM module prefix. A name matching none of them is not loaded.
VLLM_QWEN3_5_MAPPER = {
    "model.visual.": "visual.",
    "lm_head.": "language_model.lm_head.",
    "model.language_model.": "language_model.model.",
}
# qwen3_5.py @ 00def4f8: per decoder layer, with --enable-lora (lora_config set) the modules LoRA can attach to; the
# GDN layer keeps in_proj_qkv and in_proj_z separate, packs in_proj_b + in_proj_a into in_proj_ba; q/k/v pack into
# qkv_proj. Keys: HF module name (what an adapter names), values: the vLLM module it lands in.
VLLM_QWEN3_5_LORA = {
    "full_attention": {"self_attn.q_proj": "self_attn.qkv_proj", "self_attn.k_proj": "self_attn.qkv_proj",
                       "self_attn.v_proj": "self_attn.qkv_proj", "self_attn.o_proj": "self_attn.o_proj"},
    "linear_attention": {"linear_attn.in_proj_qkv": "linear_attn.in_proj_qkv",
                         "linear_attn.in_proj_z": "linear_attn.in_proj_z",
                         "linear_attn.in_proj_b": "linear_attn.in_proj_ba",
                         "linear_attn.in_proj_a": "linear_attn.in_proj_ba",
                         "linear_attn.out_proj": "linear_attn.out_proj"},
}  # fmt: skip
# vLLM, vllm/model_executor/models/qwen3_omni_moe_thinker.py @ 014630717e03239feeb273d7530dd1eee389dfb5
# (Qwen3OmniMoeThinkerForConditionalGeneration, served for the "Qwen3OmniMoeForConditionalGeneration" arch):
VLLM_OMNI_MAPPER = {
    "thinker.lm_head.": "language_model.lm_head.",
    "thinker.model.": "language_model.model.",
    "thinker.": "",
}
# newer vLLM (thinker with SupportsLoRA) adds these two for "adapters trained/saved directly from the thinker model"
VLLM_OMNI_THINKER_ADAPTER_MAPPER = {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."}


def vllm_name(name: str, mapper: dict[str, str]) -> str | None:
    """WeightsMapper.orig_to_new_prefix: the first matching prefix (dict order) is replaced."""
    for old, new in mapper.items():
        if name.startswith(old):
            return new + name[len(old) :]
    return None


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    teacher_runs.write_trajectories(d / "traj.jsonl", teacher_runs.trajectories(8))
    harvest(d / "traj.jsonl", d / "data", eval_share=0.3)
    tok = train_tokenizer(teacher_runs.texts(12), vocab_size=1024)
    return d, tok


def _tiny_omni_thinker(out: Path, tok) -> Path:
    from transformers import Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)  # fmt: skip
    audio = dict(num_mel_bins=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                 output_dim=64, downsample_hidden_size=16, n_window=4, max_source_positions=64)  # fmt: skip
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4,
                  num_position_embeddings=16, deepstack_visual_indexes=[0])  # fmt: skip
    torch.manual_seed(0)
    cfg = Qwen3OmniMoeThinkerConfig(text_config=text, audio_config=audio, vision_config=vision)
    cfg.vision_start_token_id = 151652  # in the real thinker_config (read by the rope index), not an __init__ argument
    model = Qwen3OmniMoeThinkerForConditionalGeneration(cfg)
    model.save_pretrained(out)
    _with_template(tok, "qwen3_omni.jinja").save_pretrained(out)  # the Qwen3-Omni checkpoints' own template
    return out


def _run(recipe: str, base: Path, d: Path, out: Path, *extra: str) -> dict:
    script_args, training_args, model_args = parse_args(
        [
            "--config", str(ROOT / recipe),
            "--model_name_or_path", str(base),
            "--dataset_dir", str(d / "data" / "sft"),
            "--output_dir", str(out),
            # the GPU-only settings of the recipe, overridden explicitly
            "--bf16", "false",
            "--dtype", "float32",
            "--attn_implementation", "sdpa",  # no flash attention
            "--max_steps", "1",
            "--warmup_steps", "0",  # the recipe's warm-up ratio would make the single step's learning rate 0
            "--gradient_accumulation_steps", "1",
            "--max_train_samples", "2",
            "--max_eval_samples", "2",
            "--eval_steps", "1",
            "--save_strategy", "no",
            "--logging_steps", "1",
            "--max_length", "4096",
            *extra,
        ]
    )  # fmt: skip
    assert training_args.deepspeed is None and not training_args.bf16 and training_args.use_cpu  # deepspeed off
    assert model_args.use_peft
    summary = main(script_args, training_args, model_args)
    assert summary["steps"] == 1 and summary["first_loss"] is not None and summary["eval_passes"] == 1
    assert set(summary["eval"]) >= {"eval_loss"}
    return summary


def _tensor(path: Path, key: str) -> torch.Tensor:
    f = checkpoint_keys(path)[key]
    with safe_open(str(path / f), "pt") as h:
        return h.get_tensor(key)


def _generate(model, tok) -> torch.Tensor:
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "next action?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**ids, max_new_tokens=4, do_sample=False)
    return out[0, ids["input_ids"].shape[1] :]


ALL_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]


@pytest.mark.parametrize(
    "targets,expected",
    [
        # attention-only (the paper's recipe as written): q/k/v/o of the one full-attention layer
        ([], {"full_attention": 4, "linear_attention": 0}),
        # every layer (the recipe's documented variant): + in_proj_qkv/z/b/a and out_proj of each linear layer
        (["--lora_target_modules", *ALL_LAYERS], {"full_attention": 4, "linear_attention": 15}),
    ],
)
def test_qwen3_5_recipe_lora_step_merge_reload_generate_in_the_layout_vllm_loads(data, tmp_path, targets, expected):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForConditionalGeneration

    d, tok = data
    base = _tiny_qwen3_5(tmp_path / "base", tok)
    layer_types = json.loads((base / "config.json").read_text())["text_config"]["layer_types"]
    out = tmp_path / "out"
    summary = _run("configs/sft/qwen3_5_27b.yaml", base, d, out, *targets)

    # -- where LoRA landed (training names: Qwen3_5ForCausalLM = model.layers.N...)
    per_type = {"full_attention": 0, "linear_attention": 0}
    for name in summary["lora_modules"]:
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        assert m, name
        kind = layer_types[int(m.group(1))]
        assert m.group(2) in VLLM_QWEN3_5_LORA[kind], name  # a module of that layer type that vLLM can adapt
        per_type[kind] += 1
    assert per_type == expected

    # -- the adapter vLLM serves on the original checkpoint: its names go through vLLM's mapper onto its modules
    adapter = out / "vllm_adapter"
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as h:
        keys = list(h.keys())
    assert len(keys) == 2 * sum(expected.values())
    for k in keys:
        module = k.removeprefix("base_model.model.").partition(".lora_")[0]
        mapped = vllm_name(module, VLLM_QWEN3_5_MAPPER)
        m = re.fullmatch(r"language_model\.model\.layers\.(\d+)\.(.+)", mapped or "")
        assert m and m.group(2) in VLLM_QWEN3_5_LORA[layer_types[int(m.group(1))]], (k, mapped)
    # PEFT on the original class applies it (a name mismatch would leave lora_B at zero with only a warning)
    vl = PeftModel.from_pretrained(Qwen3_5ForConditionalGeneration.from_pretrained(base), adapter)
    b = [p for n, p in vl.named_parameters() if "lora_B" in n]
    assert len(b) == sum(expected.values()) and all(p.abs().sum() > 0 for p in b)

    # serve.vllm serves OUT/vllm_adapter and refuses OUT itself (training names: vLLM would skip every module)
    from serve.vllm import VLLMServeConfig, build_vllm_command

    def serve(path):
        cfg = VLLMServeConfig(model=str(base), family="qwen3.5", layout="lora", lora_modules={"p": str(path)})
        return build_vllm_command(cfg)

    with pytest.raises(ValueError, match="vllm_adapter"):
        serve(out)
    assert f"p={adapter}" in serve(adapter)

    # -- merged: exactly the base checkpoint's tensor names, its architecture and config; towers untouched
    merged = out / "merged"
    assert set(checkpoint_keys(merged)) == set(checkpoint_keys(base))
    assert json.loads((merged / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    for key in checkpoint_keys(merged):
        assert vllm_name(key, VLLM_QWEN3_5_MAPPER) is not None, key  # every tensor has a vLLM destination
    q = "model.language_model.layers.3.self_attn.q_proj.weight"
    assert not torch.equal(_tensor(merged, q), _tensor(base, q))  # the adapter was merged
    v = next(k for k in checkpoint_keys(base) if k.startswith("model.visual."))
    assert torch.equal(_tensor(merged, v), _tensor(base, v))
    if expected["linear_attention"]:
        z = "model.language_model.layers.0.linear_attn.in_proj_z.weight"
        assert not torch.equal(_tensor(merged, z), _tensor(base, z))

    # -- reload both ways and generate
    mtok = AutoTokenizer.from_pretrained(merged)
    causal = AutoModelForCausalLM.from_pretrained(merged)
    assert type(causal).__name__ == "Qwen3_5ForCausalLM"
    assert torch.equal(causal.model.layers[3].self_attn.q_proj.weight, _tensor(merged, q))
    assert len(_generate(causal, mtok)) > 0
    full = Qwen3_5ForConditionalGeneration.from_pretrained(merged)
    assert torch.equal(full.model.language_model.layers[3].self_attn.q_proj.weight, _tensor(merged, q))


def test_qwen3_omni_recipe_adapts_text_layers_only_and_merges_in_the_thinker_layout(data, tmp_path):
    from peft import PeftModel
    from transformers import AutoTokenizer, Qwen3OmniMoeThinkerForConditionalGeneration

    d, tok = data
    base = _tiny_omni_thinker(tmp_path / "base", tok)
    out = tmp_path / "out"
    summary = _run("configs/sft/qwen3_omni_30b.yaml", base, d, out)

    # -- LoRA on the text decoder's attention only: not on the audio tower's q/k/v, not on the vision tower
    mods = summary["lora_modules"]
    assert len(mods) == 2 * 4, mods
    # training names: model.language_model.layers.N (transformers 5.24), model.layers.N (5.17, the GPU stack)
    assert all(re.fullmatch(r"model\.(language_model\.)?layers\.\d\.self_attn\.[qkvo]_proj", n) for n in mods), mods
    model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(base)
    same_names = [n for n, _ in model.named_modules() if re.search(r"self_attn\.[qkv]_proj$", n) and "audio" in n]
    assert same_names, "the audio tower has q/k/v projections the bare names would also match"

    # -- adapter in the checkpoint's names: model.layers.N... (the thinker checkpoint), which vLLM's thinker maps to
    # language_model.model.layers.N when it accepts adapters saved from the thinker
    with safe_open(str(out / "vllm_adapter" / "adapter_model.safetensors"), "pt") as h:
        modules = {k.removeprefix("base_model.model.").partition(".lora_")[0] for k in h.keys()}
    assert all(re.fullmatch(r"model\.layers\.\d\.self_attn\.[qkvo]_proj", m) for m in modules), modules
    mapped = {vllm_name(m, VLLM_OMNI_THINKER_ADAPTER_MAPPER) for m in modules}
    assert all(m.startswith("language_model.model.layers.") for m in mapped)
    pm = PeftModel.from_pretrained(model, out)  # the training-name adapter applies to the training class
    assert all(p.abs().sum() > 0 for n, p in pm.named_parameters() if "lora_B" in n)

    # -- merged: the base thinker checkpoint's names and config; every name reaches a vLLM module once the full
    # Omni checkpoint's `thinker.` prefix is in front (what to_base_layout adds when the base is the full model)
    merged = out / "merged"
    assert set(checkpoint_keys(merged)) == set(checkpoint_keys(base))
    cfg = json.loads((merged / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3OmniMoeThinkerForConditionalGeneration"]
    assert all(vllm_name("thinker." + k, VLLM_OMNI_MAPPER) is not None for k in checkpoint_keys(merged))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(_tensor(merged, q), _tensor(base, q))
    a = next(k for k in checkpoint_keys(base) if k.startswith("audio_tower.layers.0.self_attn.q_proj"))
    assert torch.equal(_tensor(merged, a), _tensor(base, a))

    reloaded = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(merged)
    assert len(_generate(reloaded, AutoTokenizer.from_pretrained(merged))) > 0


def test_trls_fused_lm_head_scores_the_omni_thinker_as_its_own_forward_does(data, tmp_path):
    """TRL's fused LM head runs `model.base_model(...)` and applies the LM head itself. With the thinker prepared as
    sft.train prepares it (expose_thinker_backbone: transformers 5.17's thinker has no backbone at `base_model`),
    the backbone's hidden states through the LM head are the thinker's own logits on a right-padded batch, and the
    fused head's loss is the cross-entropy of those logits."""
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration
    from trl.trainer.utils import add_fused_lm_head

    from sft.lm_head import ThinkerTextBackbone, expose_thinker_backbone

    d, tok = data
    model = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(_tiny_omni_thinker(tmp_path / "base", tok))
    model.eval()
    expose_thinker_backbone(model)
    rows = [tok("<|im_start|>user\nfind the clip<|im_end|>\n")["input_ids"], tok("the answer is 42")["input_ids"]]
    n = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [tok.pad_token_id] * (n - len(r)) for r in rows])
    attention_mask = torch.tensor([[1] * len(r) + [0] * (n - len(r)) for r in rows])
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        torch.testing.assert_close(model.lm_head(hidden.last_hidden_state), logits)
        add_fused_lm_head(model)
        fused = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    torch.testing.assert_close(fused.loss, ce)
    fresh = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(tmp_path / "base")
    assert list(model.state_dict()) == list(fresh.state_dict())  # nothing registered: saving is unchanged
    with pytest.raises(ValueError, match="input_features"):
        ThinkerTextBackbone(model)(input_ids=input_ids, input_features=torch.zeros(1, 16, 8))


def test_to_base_layout_adds_the_full_checkpoints_prefix(tmp_path):
    """A thinker-only save merged into a full-model base (`thinker.` prefix): base names, base config, other
    components (talker) copied, and a trained tensor without a counterpart is refused."""
    from safetensors.torch import load_file, save_file

    from sft.train import to_base_layout

    base, trained = tmp_path / "base", tmp_path / "trained"
    base.mkdir()
    trained.mkdir()
    save_file({"thinker.model.w": torch.zeros(2), "talker.w": torch.ones(2)}, str(base / "model.safetensors"))
    (base / "config.json").write_text('{"architectures": ["Qwen3OmniMoeForConditionalGeneration"]}')
    save_file({"model.w": torch.full((2,), 5.0)}, str(trained / "model.safetensors"))
    (trained / "config.json").write_text('{"architectures": ["Qwen3OmniMoeThinkerForConditionalGeneration"]}')
    assert to_base_layout(trained, base)["prefix"] == "thinker."
    w = load_file(str(trained / "model.safetensors"))
    assert set(w) == {"thinker.model.w", "talker.w"} and w["thinker.model.w"][0] == 5 and w["talker.w"][0] == 1
    assert "Qwen3OmniMoeForConditionalGeneration" in (trained / "config.json").read_text()

    save_file({"model.unknown": torch.zeros(1)}, str(trained / "model.safetensors"))
    with pytest.raises(ValueError, match="no counterpart"):
        to_base_layout(trained, base)
