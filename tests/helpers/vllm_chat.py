"""What vLLM (the version constraints/gpu.txt pins) does with a planner's chat request and the model's reply,
re-implemented for CPU tests from reading its source; tests/fixtures/vllm_tool_parsers.json holds vLLM's own outputs
for hand-written inputs, and tests/test_tool_call_symmetry.py checks this module against them before using it.

- `PARSERS[name](text, tools)` -> `Parsed(content, calls)`: the non-streaming tool-call parsing of the chat
  endpoint (`--tool-call-parser NAME`, no reasoning parser), each call as (name, arguments JSON string);
- `serving_prompt(...)`: the prompt text vLLM renders for a request (content format, tool-call arguments, tool
  dicts, template kwargs), to compare with the text SFT trained on;
- `serve_options(argv)`: the options of a `vllm serve` command line that decide both.
Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

# ---- replies: the tool-call parsers ---------------------------------------------------------------------------------


@dataclass
class Parsed:
    content: str | None
    calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments as the JSON string vLLM returns)


def parse_hermes(text: str, tools: list[dict] | None = None) -> Parsed:
    """`hermes`: JSON objects between <tool_call> and </tool_call> (or to the end of the text)."""
    start = "<tool_call>"
    if start not in text:
        return Parsed(text)
    bodies, pos = [], text.index(start)
    while pos != -1:
        body_at = pos + len(start)
        end = text.find("</tool_call>", body_at)
        if end == -1:  # an unclosed block runs to the end of the text
            bodies.append(text[body_at:])
            break
        bodies.append(text[body_at:end])
        pos = text.find(start, end + len("</tool_call>"))
    try:
        objs = [json.loads(b) for b in bodies]
        calls = [(o["name"], json.dumps(o["arguments"], ensure_ascii=False)) for o in objs]
    except (ValueError, KeyError, TypeError):  # one bad block: no call at all, the whole text is content
        return Parsed(text)
    return Parsed(text[: text.index(start)] or None, calls)


_MARKERS = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">")
_PARAM_OPEN = re.compile(r"<\s*parameter\s*=\s*")
_PARAM_CLOSE = re.compile(r"<\s*/\s*parameter\s*>")


def _pieces(text: str):
    """(marker or None, text) in order: the markers the Qwen3 parser's state machine reads, and the text between."""
    i = 0
    while i < len(text):
        hits = [(text.find(m, i), -len(m), m) for m in _MARKERS if text.find(m, i) != -1]
        if not hits:
            yield None, text[i:]
            return
        at, _, m = min(hits)
        if at > i:
            yield None, text[i:at]
        yield m, m
        i = at + len(m)


def _params(raw: str) -> dict[str, str]:
    """<parameter=NAME>VALUE values, up to </parameter> or the next <parameter=; one wrapping newline each side
    removed; a last parameter that is never closed is not taken."""
    out: dict[str, str] = {}
    opens = list(_PARAM_OPEN.finditer(raw))
    for k, m in enumerate(opens):
        gt = raw.find(">", m.end())
        if gt == -1:
            break
        name = raw[m.end() : gt]
        nxt = opens[k + 1].start() if k + 1 < len(opens) else None
        close = _PARAM_CLOSE.search(raw, gt + 1)
        if close is not None and (nxt is None or close.start() <= nxt):
            value = raw[gt + 1 : close.start()]
        elif nxt is not None:
            value = raw[gt + 1 : nxt]
        else:
            continue
        value = value[1:] if value.startswith("\n") else value
        out[name] = value[:-1] if value.endswith("\n") else value
    return out


def _schema_types(schema) -> set[str]:
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    t = schema.get("type")
    types |= {t} if isinstance(t, str) else {x for x in t or () if isinstance(x, str)}
    for v in schema.get("enum") or ():
        types.add(
            "null"
            if v is None
            else "boolean"
            if isinstance(v, bool)
            else "integer"
            if isinstance(v, int)
            else "number"
            if isinstance(v, float)
            else "string"
            if isinstance(v, str)
            else "array"
            if isinstance(v, list)
            else "object"
        )
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key) or ():
            types |= _schema_types(sub)
    return types or {"string"}


def _finite(v) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    return True


def _convert(value: str, types: set[str]):
    """A parameter's text as the schema's type, first that works of null, integer, number, boolean, object/array,
    string; else the text as JSON if it parses, else the text."""
    for t in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if t not in types:
            continue
        if t == "null" and value.lower() == "null":
            return None
        if t == "string":
            return value
        if t == "integer":
            try:
                return int(value)
            except ValueError:
                continue
        if t == "number":
            try:
                f = float(value)
            except ValueError:
                continue
            if math.isfinite(f):
                return int(f) if f == int(f) else f
        if t == "boolean" and value.lower().strip() in ("true", "1", "false", "0"):
            return value.lower().strip() in ("true", "1")
        if t in ("object", "array"):
            try:
                v = json.loads(value)
            except ValueError:
                continue
            if _finite(v):
                return v
    try:
        v = json.loads(value)
    except ValueError:
        return value
    return v if _finite(v) else value


def _properties(tools: list[dict] | None, name: str) -> dict:
    for t in tools or ():
        f = t.get("function", t)
        if f.get("name") == name:
            return (f.get("parameters") or {}).get("properties") or {}
    return {}


def parse_qwen3_xml(text: str, tools: list[dict] | None = None) -> Parsed:
    """`qwen3_coder` / `qwen3_xml` (one parser in vLLM 0.31): <tool_call><function=NAME><parameter=K>V</parameter>...
    </function></tool_call>, values typed by the tool schema."""
    state, before, after, calls = "content", [], [], []
    cur: dict | None = None
    for marker, piece in _pieces(text):
        if state == "content":
            if marker in ("<tool_call>", "<function="):
                cur = {"name": "", "raw": ""}
                calls.append(cur)
                state = "preamble" if marker == "<tool_call>" else "name"
            else:
                (after if calls else before).append(piece)
        elif state == "preamble":  # text before <function= is dropped (a hermes JSON body vanishes here)
            state = {"<function=": "name", "</tool_call>": "content"}.get(marker, "preamble")
        elif state == "name":
            if marker == ">":
                state = "args"
            elif marker == "</function>":
                state = "between"
            else:
                cur["name"] += piece
        elif state == "args":
            if marker == "</function>":
                state = "between"
            else:
                cur["raw"] += piece
        elif state == "between":
            if marker == "</tool_call>":
                state = "content"
            elif marker in ("<tool_call>", "<function="):
                cur = {"name": "", "raw": ""}
                calls.append(cur)
                state = "preamble" if marker == "<tool_call>" else "name"
    out = []
    for c in calls:
        name = c["name"].strip()
        if not name:
            continue  # (a JSON body straight after <function=... is vLLM's fallback; planners never write it)
        args = _params(c["raw"]) if c["raw"].strip() else {}
        props = _properties(tools, name)
        typed = {
            k: _convert(v, _schema_types(props[k])) if isinstance(props.get(k), dict) else v for k, v in args.items()
        }
        out.append((name, json.dumps(typed, ensure_ascii=False)))
    if out:
        return Parsed("".join(before).strip() or None, out)
    content = "".join(before + after)
    if calls and not content.strip():  # whitespace beside an opened (even rejected) call is dropped
        content = ""
    return Parsed(content or None)


PARSERS = {"hermes": parse_hermes, "qwen3_coder": parse_qwen3_xml, "qwen3_xml": parse_qwen3_xml}


# ---- requests: what the chat template is rendered with --------------------------------------------------------------


def content_format(template: str) -> str:
    """vLLM's `--chat-template-content-format auto`: 'openai' when the template iterates over a message's content
    (`for x in message.content`, or over a macro parameter that is passed message.content, or over a bare `content`
    outside macros), else 'string'."""
    import jinja2
    import jinja2.nodes as n

    ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(
        re.sub(r"{%-?\s*(generation|endgeneration)\s*-?%}", "", template)
    )

    def is_var(node, name):
        return isinstance(node, n.Name) and node.name == name

    def is_content_of(node, names):
        while isinstance(node, (n.Filter, n.Test)):
            node = node.node
        if isinstance(node, n.Getattr):
            return node.attr == "content" and any(is_var(node.node, v) for v in names)
        if isinstance(node, n.Getitem) and isinstance(node.arg, n.Const):
            return node.arg.value == "content" and any(is_var(node.node, v) for v in names)
        return False

    def refers_to(node, names):
        while isinstance(node, (n.Filter, n.Test)) or (isinstance(node, n.Getitem) and isinstance(node.arg, n.Slice)):
            node = node.node
        return any(is_var(node, v) for v in names)

    msgs = {"messages"}
    grew = True
    while grew:  # `set x = messages[...]` and the like
        grew = False
        for a in ast.find_all(n.Assign):
            if isinstance(a.target, n.Name) and a.target.name not in msgs and refers_to(a.node, msgs):
                msgs.add(a.target.name)
                grew = True
    loops = [f for f in ast.find_all(n.For) if refers_to(f.iter, msgs) and isinstance(f.target, n.Name)]
    loop_vars = {f.target.name for f in loops}
    macro_params, in_macros = {}, set()
    for macro in ast.find_all(n.Macro):
        names = {a.name for a in macro.args}
        fed = set()
        for call in ast.find_all(n.Call):
            if is_var(call.node, macro.name):
                args = call.args[: len(macro.args)]
                fed |= {macro.args[i].name for i, a in enumerate(args) if is_content_of(a, loop_vars)}
                fed |= {k.key for k in call.kwargs if k.key in names and is_content_of(k.value, loop_vars)}
        for loop in macro.find_all(n.For):
            in_macros.add(id(loop))
            if fed:
                macro_params[id(loop)] = fed
    for loop in ast.find_all(n.For):
        it = loop.iter
        if is_content_of(it, loop_vars):
            return "openai"
        if isinstance(it, n.Name) and it.name in macro_params.get(id(loop), ()):
            return "openai"
        if id(loop) not in in_macros and is_var(it, "content"):
            return "openai"
    return "string"


def serving_messages(messages: list[dict], fmt: str) -> list[dict]:
    """The conversation vLLM hands the template: content as a string ('string') or a list of text parts ('openai';
    tool messages joined back to a string), only the fields it keeps, assistant tool-call arguments as mappings."""
    out = []
    for m in messages:
        content = m.get("content")
        parts = [] if content is None else [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = [p["text"] if isinstance(p, dict) else p for p in parts]
        msg = {"role": m["role"], "content": [dict(p) for p in parts] if fmt == "openai" else "\n".join(texts)}
        if m["role"] == "tool" and isinstance(msg["content"], list):
            msg["content"] = "\n".join(texts)
        if m["role"] == "assistant" and m.get("tool_calls") is not None:
            msg["tool_calls"] = [json.loads(json.dumps(tc)) for tc in m["tool_calls"]]
        if m["role"] == "tool" and "tool_call_id" in m:
            msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if m.get("reasoning") is not None:
            msg["reasoning"] = msg["reasoning_content"] = m["reasoning"]
        out.append(msg)
    for msg in out:
        calls = msg.get("tool_calls")
        if msg["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del msg["tool_calls"]
            continue
        for tc in calls:
            f = tc["function"]
            args = f.get("arguments")
            if isinstance(args, str) and args:
                try:
                    args = json.loads(args)
                except ValueError:
                    args = {}
            f["arguments"] = args if isinstance(args, dict) and args else {}
    return out


def serving_tools(tools: list[dict] | None) -> list[dict] | None:
    """Request tools as the template sees them: {type, function: {name, description, parameters}} in that order,
    description/parameters None when the request has none, other fields dropped (strict only when set)."""
    if tools is None:
        return None
    out = []
    for t in tools:
        f = t["function"]
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        if f.get("strict") is not None:
            fn["strict"] = f["strict"]
        out.append({"type": t.get("type", "function"), "function": fn})
    return out


def template_kwargs(template: str, kwargs: dict) -> dict:
    """Only the kwargs the template reads (vLLM drops the others before rendering)."""
    import jinja2
    import jinja2.meta

    names = jinja2.meta.find_undeclared_variables(
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(
            re.sub(r"{%-?\s*(generation|endgeneration)\s*-?%}", "", template)
        )
    )
    return {k: v for k, v in kwargs.items() if k in names}


def serving_prompt(
    tok,
    template: str,
    messages: list[dict],
    tools: list[dict] | None,
    default_kwargs: dict | None,
    fmt: str,
    request_kwargs: dict | None = None,
) -> str:
    """The prompt text of a chat request: defaults (--default-chat-template-kwargs) overridden by the request's
    chat_template_kwargs, the generation prompt on."""
    kwargs = {**(default_kwargs or {}), **{k: v for k, v in (request_kwargs or {}).items() if v is not None}}
    return tok.apply_chat_template(
        serving_messages(messages, fmt),
        tools=serving_tools(tools),
        chat_template=template,
        add_generation_prompt=True,
        continue_final_message=False,
        tokenize=False,
        **template_kwargs(template, kwargs),
    )


def serve_options(argv: list[str]) -> dict:
    """The tool-call parser, the default template kwargs and the content format of a `vllm serve` command."""

    def opt(flag, default=None):
        return argv[argv.index(flag) + 1] if flag in argv else default

    return {
        "tool_call_parser": opt("--tool-call-parser") if "--enable-auto-tool-choice" in argv else None,
        "default_chat_template_kwargs": json.loads(opt("--default-chat-template-kwargs", "{}")),
        "content_format": opt("--chat-template-content-format", "auto"),
    }
