"""A small OpenAI-compatible chat server around a transformers checkpoint (CPU tests, the CPU demo, tiny models).

    python -m serve.local --model runs/sft/tiny/merged --port 8011 [--host 127.0.0.1] [--name tiny]
    python -m serve.local --config configs/serve/tiny_local.yaml

Endpoints: POST /v1/chat/completions (messages + tools -> chat template -> generate -> `<tool_call>` blocks parsed into
message.tool_calls), GET /v1/models, GET /health. Generation is serialized by one lock: one model, one request at a
time (the collect stage's concurrency just queues). GPU serving of real models is serve/vllm.py.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import torch
import uvicorn
import yaml
from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from transformers import AutoModelForCausalLM, AutoTokenizer

from collect.actions import TOOL_CALL_RE

DEFAULT_MAX_TOKENS = 640


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(remaining content, OpenAI tool_calls) from generated text. A block that is not a JSON object with a name
    stays in the content, so a malformed action reaches the caller (and the loop counts a model error)."""
    calls, kept = [], []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str):
                raise TypeError("name")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            continue
        kept.append(text[pos : m.start()])
        pos = m.end()
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


class ChatModel:
    """A tokenizer + causal LM with a lock around generation."""

    def __init__(self, model_dir: str | os.PathLike, name: str | None = None):
        if not (Path(model_dir) / "config.json").exists():
            raise FileNotFoundError(f"--model {model_dir}: no config.json (expected a save_pretrained checkpoint)")
        self.name = name or Path(model_dir).name
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
        if torch.cuda.is_available():
            self.model.to("cuda")
        self.lock = threading.Lock()

    def complete(self, body: dict) -> dict:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "messages: a non-empty list is required")
        tools = body.get("tools") or None
        try:
            enc = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
        except Exception as e:  # template errors name the offending message field
            raise HTTPException(400, f"messages/tools could not be rendered by the chat template: {e}") from e
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
        max_new = int(body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS)
        gen_kwargs = {"max_new_tokens": max_new, "pad_token_id": self.tokenizer.pad_token_id}
        if temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=temperature, top_p=float(body.get("top_p") or 1.0))
        else:
            gen_kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if body.get("seed") is not None:
            torch.manual_seed(int(body["seed"]))
        with self.lock, torch.inference_mode():
            out = self.model.generate(**enc, **gen_kwargs)
        n_prompt = int(enc["input_ids"].shape[1])
        new = out[0, n_prompt:]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        hit_eos = bool(len(new)) and int(new[-1]) == self.tokenizer.eos_token_id
        content, calls = parse_tool_calls(text)
        finish = "tool_calls" if calls else ("stop" if hit_eos or len(new) < max_new else "length")
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": int(len(new)),
                "total_tokens": n_prompt + int(len(new)),
            },
        }


def create_app(model_dir: str | os.PathLike, name: str | None = None) -> FastAPI:
    """The FastAPI app serving one checkpoint."""
    chat = ChatModel(model_dir, name)
    app = FastAPI(title="omni-decision local server")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model": chat.name}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": chat.name, "object": "model", "created": 0, "owned_by": "local"}]}

    @app.post("/v1/chat/completions")
    def completions(body: dict) -> JSONResponse:  # sync handler: runs in the threadpool, the lock serializes
        if body.get("stream"):
            raise HTTPException(400, "stream=true is not supported by serve.local")
        if (body.get("n") or 1) != 1:
            raise HTTPException(400, "n must be 1")
        return JSONResponse(chat.complete(body))

    return app


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalServer:
    """Serve a checkpoint from a background thread (tests, demo): `with LocalServer(dir) as srv: srv.base_url`."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        host: str = "127.0.0.1",
        port: int | None = None,
        name: str | None = None,
        startup_timeout_s: float = 120.0,
    ):
        self.model_dir, self.host, self.name = model_dir, host, name
        self.port = port or free_port(host)
        self.startup_timeout_s = startup_timeout_s
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __enter__(self) -> LocalServer:
        app = create_app(self.model_dir, self.name)
        cfg = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, name="serve.local", daemon=True)
        self._thread.start()
        deadline = time.time() + self.startup_timeout_s
        while time.time() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError(f"serve.local on {self.host}:{self.port} exited during startup")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise TimeoutError(f"serve.local did not answer /v1/models on port {self.port} in {self.startup_timeout_s}s")

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible local server for a transformers checkpoint")
    ap.add_argument("--config", help="YAML with model, host, port, name (CLI flags override)")
    ap.add_argument("--model", help="save_pretrained checkpoint directory")
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--name", default=None, help="served model name (default: the directory name)")
    a = ap.parse_args(argv)
    cfg = yaml.safe_load(Path(a.config).read_text()) if a.config else {}
    model = a.model or cfg.get("model")
    if not model:
        ap.error("--model (or model: in --config) is required")
    host = a.host or cfg.get("host", "127.0.0.1")
    port = a.port or cfg.get("port", 8011)
    uvicorn.run(create_app(model, a.name or cfg.get("name")), host=host, port=int(port), log_level="info")


if __name__ == "__main__":
    main()
