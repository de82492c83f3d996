"""JSON at the process boundary: strict decoding of text the project does not control, strict encoding of every
file it writes, and known secrets removed from everything written.

Python's json module is not RFC 8259 JSON on either side. It reads and writes the bare tokens NaN, Infinity and
-Infinity (and reads 1e400 as inf), which strict readers (jq, JavaScript's JSON.parse, serde, Arrow) reject; a
5,000-digit integer makes it raise ValueError (Python's int-string limit), deep nesting RecursionError, input of the
wrong type TypeError. So:

* `loads(text)` is the one decoder of model replies (planner tool calls, critic and need-parser JSON), endpoint reply
  bodies and recorded trajectory lines: it refuses NaN/Infinity/-Infinity and numbers that overflow a float, and
  turns every failure mode of the decoder into one `BadJSON` (a ValueError), so a caller catches one thing and makes
  it a model error, a malformed-response fault, or a skipped line.
* `dumps(obj)` / `write_json(path, obj)` are the encoders of every file written: trajectories, harvested rows,
  summaries and stats. A value JSON cannot hold is refused (`NotJSON`, naming its path in the object, e.g.
  `steps[3].action.arguments.time_range[1]`) or, for measured figures (`nonfinite="string"`: summaries, stats, a
  training loss that went NaN), written as the string "NaN", "Infinity" or "-Infinity": valid JSON that no reader
  takes for a number.
* Every text written through them has the known secrets removed (`secret_values`: the values of the key variables
  that endpoint configs name, registered with `register_key_env`), model output included. `redact` is the stronger
  pass for error texts and log lines (also key-shaped strings: `sk-...`, `Bearer ...`); `RedactingFilter` applies it
  to every log record a handler emits.

This module imports nothing of collect (collect.llm, a leaf itself, imports it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

REDACTED = "[REDACTED]"
MIN_SECRET_CHARS = 6  # shorter values ("EMPTY", the vLLM convention for no key) are not redacted: too common as text
DECODE_ERRORS = (ValueError, TypeError, OverflowError, RecursionError)  # what json.loads can raise on hostile input


class BadJSON(ValueError):
    """Text that is not strict JSON (syntax, NaN/Infinity, a float overflow, an integer past Python's digit limit,
    nesting past the recursion limit, or not text at all)."""


class NotJSON(ValueError):
    """A value that cannot be written as strict JSON (NaN, Infinity, -Infinity); the message names its path."""


# --------------------------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------------------------


def _refuse_constant(token: str):
    raise BadJSON(f"{token} is not a JSON number (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise BadJSON(f"{text[:40]} overflows a float (not a finite number)")
    return x


def loads(text: str | bytes | bytearray) -> Any:
    """Strict JSON: the decoded value, or BadJSON for anything else (every failure mode of the decoder included)."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except BadJSON:
        raise
    except RecursionError:
        raise BadJSON("nested too deep to decode") from None
    except DECODE_ERRORS as e:
        msg = str(e)
        if "Exceeds the limit" in msg:  # Python's int-string limit (sys.get_int_max_str_digits)
            msg = "an integer with more digits than Python reads (int-string limit)"
        raise BadJSON(msg[:300]) from None


def nonfinite_at(obj: Any, *, dotted: bool = False) -> tuple[str, float] | None:
    """(path, value) of the first NaN/Infinity float in a JSON-like value, else None (iterative). Path: `a.b[1]`, or
    with `dotted` `a.b.1` (the task-file messages' style, pydantic's)."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return path or "(root)", v
        elif isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k)) for k, x in reversed(list(v.items())))
        elif isinstance(v, list | tuple):
            for i, x in reversed(list(enumerate(v))):
                stack.append((x, (f"{path}.{i}" if path else str(i)) if dotted else f"{path}[{i}]"))
    return None


def _map_leaves(obj: Any, fn) -> Any:
    """A copy of a JSON-like value with `fn` applied to every leaf and every dict key (iterative)."""
    root: list = [None]
    stack: list[tuple[Any, Any, Any]] = [(obj, root, 0)]
    while stack:
        v, parent, key = stack.pop()
        if isinstance(v, dict):
            out: dict = {}
            parent[key] = out
            for k, x in v.items():
                ck = fn(k)
                out[ck] = None
                stack.append((x, out, ck))
        elif isinstance(v, list | tuple):
            lst = [None] * len(v)
            parent[key] = lst
            stack.extend((x, lst, i) for i, x in enumerate(v))
        else:
            parent[key] = fn(v)
    return root[0]


# --------------------------------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------------------------------

_KEY_ENVS: set[str] = set()  # env var names that hold endpoint keys (every client and run registers its own)
_KEYISH_ENV = re.compile(r"(API_?KEY|_KEY|TOKEN|SECRET|PASSWORD)$", re.IGNORECASE)
_TOKEN = r"[A-Za-z0-9._~+/=\-]"
_KEY_PATTERNS = (
    re.compile(r"\bsk-" + _TOKEN + r"{4,}"),  # OpenAI-style keys: sk-..., sk-proj-...
    re.compile(r"(?i)\b(bearer|basic)\s+" + _TOKEN + r"{4,}"),
    # a long token (with a digit) shortly after "key" / "token" / "secret": `api_key=...`, `key provided: ...`
    re.compile(
        r"(?i)\b(api[_ -]?key|key|token|secret|password)\b([\W]{0,3}[A-Za-z]{0,10}[\W]{1,3})"
        r"(?=" + _TOKEN + r"*\d)" + _TOKEN + r"{16,}"
    ),
)


def register_key_env(name: str | None) -> None:
    """Make every write (`dumps`, `write_json`) and `redact` remove the value of env var `name` (endpoint configs
    name their key's variable)."""
    if name:
        _KEY_ENVS.add(name)


def secret_values() -> list[str]:
    """The values of the registered key variables that are set (at least MIN_SECRET_CHARS long), longest first."""
    vals = {os.environ.get(n) or "" for n in _KEY_ENVS}
    return sorted((v for v in vals if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def _known_keys() -> list[str]:
    names = set(_KEY_ENVS) | {n for n in os.environ if _KEYISH_ENV.search(n)}
    vals = {os.environ.get(n) or "" for n in names}
    return sorted((v for v in vals if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def redact(text: object) -> str:
    """`text` without secrets, for error texts and logs: the values of the key env vars endpoints name (and of env
    vars named like keys), and key-shaped strings (`sk-...`, `Bearer ...`, a long token after `key`/`token`/
    `secret`)."""
    s = str(text)
    for v in _known_keys():
        s = s.replace(v, REDACTED)
    s = _KEY_PATTERNS[0].sub(REDACTED, s)
    s = _KEY_PATTERNS[1].sub(lambda m: f"{m.group(1)} {REDACTED}", s)
    return _KEY_PATTERNS[2].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", s)


def redact_values(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of a JSON-like value with every known secret value replaced in every string (keys included). Only the
    exact values: model text that merely looks like a key is data and stays."""
    secrets = secret_values() if secrets is None else secrets
    if not secrets:
        return obj

    def fn(v):
        if isinstance(v, str):
            for s in secrets:
                if s in v:
                    v = v.replace(s, REDACTED)
        return v

    return _map_leaves(obj, fn)


class RedactingFilter(logging.Filter):
    """A handler filter that passes every record with `redact` applied to its message and traceback text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: the handler reports it, as without the filter
            return True
        clean = redact(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add a RedactingFilter to every handler of `logger` (default: the root logger) that has none yet."""
    for h in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())


# --------------------------------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------------------------------

_AS_STRING = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _nonfinite_as_string(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else _AS_STRING[v]
    return v


def _contains(text: str, secret: str, kw: dict) -> bool:
    """Whether `secret` appears in JSON text, as itself or in its escaped form (a quote, backslash or non-ASCII)."""
    if secret in text:
        return True
    escaped = json.dumps(secret, ensure_ascii=kw.get("ensure_ascii", True))[1:-1]
    return escaped != secret and escaped in text


def dumps(obj: Any, *, nonfinite: str = "refuse", what: str = "value", **kw) -> str:
    """`json.dumps(obj, **kw)` as strict JSON with the known secrets removed from every string.

    nonfinite: "refuse" (NotJSON naming the path of the first NaN/Infinity, prefixed by `what`) or "string" (written
    as "NaN", "Infinity", "-Infinity"). The common case costs one encoding plus a substring scan per secret."""
    if nonfinite not in ("refuse", "string"):
        raise ValueError(f"nonfinite must be 'refuse' or 'string', got {nonfinite!r}")
    try:
        text = json.dumps(obj, allow_nan=False, **kw)
    except ValueError as e:
        if "Out of range float" not in str(e):
            raise
        if nonfinite == "refuse":
            at = nonfinite_at(obj)
            where = f"{at[0]} is {at[1]!r}" if at else "a value is NaN or infinite"
            raise NotJSON(f"{what}: {where}, which JSON cannot hold (no NaN or Infinity)") from None
        obj = _map_leaves(obj, _nonfinite_as_string)
        text = json.dumps(obj, allow_nan=False, **kw)
    found = [s for s in secret_values() if _contains(text, s, kw)]
    if found:
        text = json.dumps(redact_values(obj, found), allow_nan=False, **kw)
    return text


def write_json(path: str | Path, obj: Any, *, nonfinite: str = "string", indent: int | None = 1, **kw) -> None:
    """Write `obj` to `path` as strict, redacted JSON (a trailing newline), atomically: a temporary file next to it,
    then os.replace, so a reader never sees half a file. Default nonfinite="string": summaries and stats."""
    path = Path(path)
    text = dumps(obj, nonfinite=nonfinite, what=str(path), indent=indent, **kw) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
