"""Planner specs: the one home of how a planner is named on the command line, in a recipe and as a served endpoint.

A planner spec is one of
  "offline"                         the privileged teacher planner (an upper reference, not a model)
  {checkpoint: DIR}                 a transformers checkpoint, served on CPU by serve.local while it is used
                                    ({checkpoint: DIR, endpoint: {max_tokens: 64}} overrides PLANNER_ENDPOINT for it)
  {endpoint: {base_url, model, api_key_env, ...}}   any OpenAI-compatible server (vLLM on a GPU node, an API)
On the command line (`PLANNER=` / `--planner`): offline | a checkpoint directory | URL#model, the key of a URL
planner read from the environment variable PLANNER_API_KEY (PLANNER_KEY_ENV).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from collect.config import EndpointConfig
from serve.checks import checkpoint_problem
from serve.local import LocalServer

# What a served or URL planner is asked for unless a recipe says otherwise (pipeline.eval's `planner_endpoint`,
# pipeline.onpolicy's `planner_endpoint`, pipeline.relabel's --max-tokens): a code_executor call is ~480 tokens.
PLANNER_ENDPOINT = {"max_tokens": 640, "timeout_s": 120.0, "max_retries": 2}
PLANNER_KEY_ENV = "PLANNER_API_KEY"  # the key of a planner given as URL#model
SERVED_KEYS = ("base_url", "model", "served_from")  # set by planner_endpoint for a checkpoint it serves


def parse_planner_arg(planner: str):
    """PLANNER=offline | a checkpoint directory | an OpenAI-compatible URL (URL#model; model defaults to `planner`,
    the name serve.vllm serves and serve.local answers to). A URL planner sends the key in PLANNER_API_KEY when that
    variable is set, and no key otherwise (a local vLLM)."""
    if planner == "offline":
        return "offline"
    if planner.startswith(("http://", "https://")):
        url, _, model = planner.partition("#")
        key_env = PLANNER_KEY_ENV if os.environ.get(PLANNER_KEY_ENV) else None
        return {"endpoint": {"base_url": url, "model": model or "planner", "api_key_env": key_env}}
    if not Path(planner).is_dir():
        raise ValueError(f"PLANNER={planner!r} is neither 'offline', a URL#model nor an existing checkpoint directory")
    return {"checkpoint": planner}


def planner_name(planner: str) -> str:
    """The cell name of a planner given on the command line: `offline`; a checkpoint's folder path below the working
    directory with '/' as '-' (runs/sft/merged -> runs-sft-merged, so two checkpoints named `merged` stay apart); a
    URL planner's host, port and model (127.0.0.1-8000-qwen35-planner)."""
    if planner == "offline":
        return "offline"
    if planner.startswith(("http://", "https://")):
        url, _, model = planner.partition("#")
        u = urlsplit(url)
        parts = [u.hostname or "endpoint", str(u.port) if u.port else "", model or "planner"]
    else:
        p = Path(planner.rstrip("/"))
        try:
            p = p.resolve().relative_to(Path.cwd().resolve())
        except ValueError:
            p = Path(*p.parts[-2:]) if len(p.parts) > 1 else p
        parts = list(p.parts)
    name = "-".join(x for x in parts if x and x not in ("/", "."))
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip("-") or "planner"


def require_checkpoint(spec: dict, who: str = "planner") -> str:
    """The checkpoint folder of a {checkpoint: DIR} planner spec; FileNotFoundError naming `who` when it is missing or
    not a servable save_pretrained checkpoint (checked before a server or any process starts)."""
    ckpt = spec["checkpoint"]
    if not Path(ckpt).is_dir():
        raise FileNotFoundError(f"{who}: checkpoint not found: {ckpt}")
    if problem := checkpoint_problem(ckpt):
        raise FileNotFoundError(f"{who}: {problem}")
    return ckpt


def checkpoint_fingerprint(path: str | os.PathLike) -> str:
    """What a locally served checkpoint is, for run config hashes: the name, size and modification time of every file
    in its directory (hashed). The server's port changes every run and must not (a rerun resumes its OUT); a checkpoint
    trained again, or another one at the same path, must (the OUT then refuses to mix them). Cheap: nothing is read."""
    entries = []
    for f in sorted(Path(path).resolve().iterdir()):
        if f.is_file():
            st = f.stat()
            entries.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()[:16]


@contextlib.contextmanager
def planner_endpoint(spec, defaults: dict | None = None):
    """Yield an EndpointConfig (or None for the offline planner), serving a checkpoint locally while in use."""
    defaults = PLANNER_ENDPOINT if defaults is None else defaults
    if spec == "offline":
        yield None
    elif "checkpoint" not in spec:
        yield EndpointConfig(**{**defaults, **spec["endpoint"]})
    else:
        ckpt = require_checkpoint(spec)
        served_from = checkpoint_fingerprint(ckpt)
        with LocalServer(ckpt) as server:
            overrides = spec.get("endpoint") or {}
            settings = {k: v for k, v in {**defaults, **overrides}.items() if k not in SERVED_KEYS}
            yield EndpointConfig(**settings, base_url=server.base_url, model=Path(ckpt).name, served_from=served_from)


def trained_task_ids(checkpoint: str | os.PathLike, _seen: set | None = None) -> set[str] | None:
    """The tasks a checkpoint planner was trained on, as its training runs recorded them: rl.train's rl_summary.json
    in the checkpoint, sft.train's train_summary.json in it or in the folder above its `merged` checkpoint, followed
    back through the checkpoint each run started from (an on-policy round fine-tunes the previous planner, GRPO starts
    from SFT). None when no summary describes it (an untrained base, a checkpoint trained elsewhere)."""
    seen = set() if _seen is None else _seen
    d = Path(checkpoint).resolve()
    if d in seen:
        return set()
    seen.add(d)
    for f in (d / "rl_summary.json", d / "train_summary.json", d.parent / "train_summary.json"):
        try:
            s = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if f.name == "train_summary.json" and f.parent != d and Path(str(s.get("merged"))).resolve() != d:
            continue  # the folder above is another checkpoint's training run (e.g. the SFT run beside its base)
        rl = f.name == "rl_summary.json"
        start = ((s.get("config") or {}).get("model") or {}).get("model_name_or_path") if rl else s.get("model")
        ids = {str(t) for t in s.get("trained_task_ids") or []}
        if start and Path(start).is_dir():
            ids |= trained_task_ids(start, seen) or set()
        return ids
    return None
