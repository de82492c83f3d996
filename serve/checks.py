"""What a server needs before it loads anything: a checkpoint folder it can serve, a port it can bind. Light (no
torch): serve.local, serve.vllm and pipeline.planners check with it before a model is loaded or a process starts."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

LAYOUT = (
    "config.json, the weights (*.safetensors or *.bin) and the tokenizer (tokenizer.json or tokenizer_config.json)"
)


def checkpoint_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a save_pretrained checkpoint a server can load (None when it is): the folder, its config, its
    weights, its tokenizer, or an adapter folder where a full model is expected (sft.train writes OUT/merged)."""
    p = Path(path)
    if not p.is_dir():
        return f"{p}: no such checkpoint folder (nothing is downloaded: give a local save_pretrained folder)"
    names = {f.name for f in p.iterdir()}
    if "adapter_config.json" in names and "config.json" not in names:
        return f"{p} is a LoRA adapter, not a full model: serve the merged checkpoint (sft.train writes OUT/merged)"
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(n.endswith((".safetensors", ".bin")) for n in names):
        missing.append("weights (*.safetensors or *.bin)")
    if not names & {"tokenizer.json", "tokenizer_config.json"}:
        missing.append("a tokenizer (tokenizer.json or tokenizer_config.json)")
    if missing:
        return f"{p} is not a save_pretrained checkpoint: it has no {', no '.join(missing)}; expected {LAYOUT}"
    return None


def port_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (None when it can): checked before the model is loaded."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            what = "in use by another process" if e.errno == errno.EADDRINUSE else e.strerror
            return f"cannot listen on {host}:{port}: {what}; stop that server or choose another port (--port / port:)"
    return None
