"""Planner actions: parsing a planner reply into exactly one tool call, and validating it against the tool schemas.

Shared by the runtime loop, the `valid` reward and evaluation, so "valid action" means one thing everywhere."""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from dataclasses import dataclass

import jsonschema

from collect import bounds, jsonio

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
# References (RuntimeConfig.references): text the planner writes instead of copying what the ledger already holds,
# substituted by the runtime before validation and the tool. The kinds, in the order the prompt states their rules:
#   need    "{need:K}" in a query is need K's filled value, in code its Python literal
#   window  "{window:K}" as the whole time_range is the time window need K names (Ledger.named_windows), e.g.
#           [35.0, 50.0] for "between 35 s and 50 s"
#   focus   "{focus:K}" in a query is need K's query_focus (what the ledger says to search for), in code a computation
#           need's formula; resolved in the same pass as "{need:K}", so text a reference brings in is never read again
REFERENCE_KINDS = ("need", "window", "focus")
VALUE_REF_KEYS = ("query", "code")  # the string arguments a need or focus reference may appear in
WINDOW_REF_RE = re.compile(r"\{window:(\d+)\}")
TEXT_REF_RE = re.compile(r"\{(need|focus):(\d+)\}")


def _ref_text(key: str, value: str) -> str:
    """What "{need:K}" stands for in argument `key`: the value itself in a query, the value as a Python string literal
    (repr) in code, so `v1 = {need:1}` is a well-formed assignment whatever the value holds (quotes, backslashes)."""
    return repr(value) if key == "code" else value


@dataclass(frozen=True)
class Action:
    name: str
    arguments: dict

    def to_dict(self) -> dict:
        return {"name": self.name, "arguments": self.arguments}

    def to_text(self) -> str:
        """Canonical text form (hermes/Qwen style) used in SFT completions and by the local server."""
        return "<tool_call>\n" + json.dumps(self.to_dict(), ensure_ascii=False) + "\n</tool_call>"

    def to_tool_call(self, call_id: str = "call_0") -> dict:
        """OpenAI message `tool_calls` entry (arguments as a JSON string)."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


class ActionError(ValueError):
    """What the model got wrong; `kind` is one of ledger.MODEL_ERROR_KINDS."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


def _loads(text: str, max_depth: int, what: str):
    """Model-written JSON: parse errors (every failure mode of the decoder, NaN/Infinity and numbers past what a float
    or Python's int-string limit holds included: collect.jsonio.loads) and hostile nesting are ActionErrors; strings
    come back UTF-8-safe."""
    try:
        return bounds.clean_json(bounds.loads(text, max_depth), max_depth)
    except bounds.TooDeep as e:
        raise ActionError("too_deep", f"{what}: {e}") from None
    except jsonio.BadJSON as e:
        raise ActionError("unparseable", f"{what} is not JSON: {e}") from None


def _decode_args(args, max_depth: int) -> dict:
    if isinstance(args, dict):  # already decoded (an endpoint's object, a local model's parse): same number rules
        try:
            out = bounds.clean_json(args, max_depth)
        except bounds.TooDeep as e:
            raise ActionError("too_deep", f"arguments: {e}") from None
        bad = jsonio.nonfinite_at(out)
        if bad is not None:
            raise ActionError("unparseable", f"arguments are not JSON: {bad[0]} is {bad[1]!r}, not a finite number")
        return out
    if args is None or (isinstance(args, str) and not args.strip()):
        return {}
    if isinstance(args, str):
        v = _loads(args, max_depth, "arguments")
        if not isinstance(v, dict):
            raise ActionError("bad_arguments", "arguments must be a JSON object")
        return v
    raise ActionError("bad_arguments", f"arguments of type {type(args).__name__}")


def parse_action(text: str | None, tool_calls: list | None = None, *, max_depth: int = 32) -> Action:
    """One action from a planner reply: native `tool_calls` first, else `<tool_call>{json}</tool_call>` text,
    else a bare JSON object with name/arguments. Raises ActionError when there is not exactly one call."""
    calls = []
    for tc in tool_calls or []:
        f = tc.get("function", tc) if isinstance(tc, dict) else tc
        if not isinstance(f, dict):
            raise ActionError("unparseable", f"tool call of type {type(f).__name__}")
        calls.append((f.get("name"), f.get("arguments")))
    if not calls and text:
        blocks = TOOL_CALL_RE.findall(text)
        if not blocks and "<tool_call>" in text:
            raise ActionError("unparseable", "unterminated <tool_call> block")
        if not blocks:
            stripped = text.strip()
            if stripped.startswith("{") and stripped.endswith("}"):
                blocks = [stripped]
        for b in blocks:
            obj = _loads(b, max_depth, "tool call")
            if not isinstance(obj, dict):
                raise ActionError("unparseable", "tool call must be a JSON object")
            calls.append((obj.get("name"), obj.get("arguments", obj.get("parameters", {}))))
    if not calls:
        raise ActionError("no_action", "the reply contains no tool call")
    if len(calls) > 1:
        raise ActionError("unparseable", f"{len(calls)} tool calls in one turn; exactly one is allowed")
    name, args = calls[0]
    if not isinstance(name, str) or not name:
        raise ActionError("unparseable", "tool call without a name")
    return Action(name, _decode_args(args, max_depth))


def schema_index(tools: list[dict]) -> dict[str, dict]:
    out = {}
    for t in tools:
        f = t.get("function", t)
        out[f["name"]] = f.get("parameters", {"type": "object"})
    return out


@functools.lru_cache(maxsize=4096)
def _validator(schema_json: str):
    """A compiled validator per distinct schema (checking the schema itself once, not on every action)."""
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


# The keywords `_surely_valid` checks itself; a schema using any other goes to jsonschema.
_FAST_KEYWORDS = frozenset(
    ("type", "properties", "required", "additionalProperties", "enum", "minimum", "minItems", "maxItems", "items")
    + ("description",)
)


def _num(v) -> bool:
    return type(v) is int or (type(v) is float and math.isfinite(v))


def _surely_valid(schema, x) -> bool:
    """True only when `x` certainly satisfies `schema` (the plain subset the tool schemas use, checked at least as
    strictly as jsonschema does: exact JSON types, no bools as numbers, finite numbers only, string-only enums).
    False means "not sure": validate_action then asks jsonschema, whose verdict and message stand. Most actions are
    valid, and jsonschema's generic walk cost more than the rest of parsing an action."""
    if type(schema) is not dict or not schema.keys() <= _FAST_KEYWORDS:
        return False
    t = schema.get("type")
    if t == "object":
        if type(x) is not dict:
            return False
        props = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties", True)
        if type(props) is not dict or type(required) is not list or extra not in (True, False):
            return False
        if any(k not in x for k in required):
            return False
        for k, v in x.items():
            sub = props.get(k)
            if sub is None:
                if extra is not True:
                    return False
            elif not _surely_valid(sub, v):
                return False
    elif t == "string":
        if type(x) is not str:
            return False
    elif t == "integer" or t == "number":
        if not (type(x) is int if t == "integer" else _num(x)):
            return False
        if "minimum" in schema and not (_num(schema["minimum"]) and x >= schema["minimum"]):
            return False
    elif t == "array":
        if type(x) is not list:
            return False
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", len(x))
        if type(lo) is not int or type(hi) is not int or not lo <= len(x) <= hi:
            return False
        if "items" in schema and not all(_surely_valid(schema["items"], v) for v in x):
            return False
    else:
        return False
    if "enum" in schema:
        enum = schema["enum"]
        if type(x) is not str or type(enum) is not list or not all(type(e) is str for e in enum) or x not in enum:
            return False
    return True


def _check_beyond_schema(action: Action) -> None:
    """What the tool schemas do not say but the tools refuse (collect.tools): a `time_range` that ends before it
    starts, a blank `query` or `code`. Refused by the tool, such a call was a tool error, which counts as a failed
    attempt on the need (three make it unfillable), and the `valid` reward scored it valid. It is the planner's
    malformed call, so it is rejected here, in the one place the runtime, the reward and evaluation share."""
    args = action.arguments
    tr = args.get("time_range")
    if type(tr) is list and len(tr) == 2 and all(_num(v) for v in tr) and tr[0] > tr[1]:
        raise ActionError("bad_arguments", f"{action.name}.time_range: {tr} ends before it starts")
    for key in ("query", "code"):
        if type(args.get(key)) is str and not args[key].strip():
            raise ActionError("bad_arguments", f"{action.name}.{key}: must not be blank")


# The ledger arm's planner prompt ends with one rule per offered kind, in REFERENCE_KINDS order; a planner (the offline
# teacher, relabelling) and the rewards know which references a prompt offers from these lines: offered_refs.
_NEED_RULE = (
    'Value references: in a query or code, "{need:K}" stands for the value of filled need K and is replaced by it '
    "before the tool runs (in code by the value as a Python string literal); write it instead of copying the value, "
    'e.g. "{need:0} market town" or v1 = {need:1}.\n'
)
_WINDOW_RULE = (
    'Window references: a time_range may be "{window:K}", the time window that need K names (e.g. [35.0, 50.0] for '
    '"between 35 s and 50 s"), and is replaced by it before the tool runs; write it instead of copying the numbers, '
    'e.g. "time_range": "{window:0}".\n'
)
_FOCUS_RULE = (
    'Focus references: in a query, "{focus:K}" stands for the query_focus of need K, in code for the formula after '
    '"compute:" in it, and is replaced by it before the tool runs; write it instead of copying, e.g. "{need:0} '
    '{focus:1}" or print(fmt({focus:3})).\n'
)
REFERENCE_RULES = {"need": _NEED_RULE, "window": _WINDOW_RULE, "focus": _FOCUS_RULE}


def reference_kinds(kinds, where: str = "references") -> tuple[str, ...]:
    """`kinds` (a list of REFERENCE_KINDS names) checked and put in REFERENCE_KINDS order, each once: the order the
    prompt states their rules in, whatever order a recipe lists them. An unknown name is a ValueError naming `where`,
    the allowed names and the closest one."""
    if isinstance(kinds, str) or not isinstance(kinds, list | tuple):
        raise ValueError(f"{where}: expected a list of reference kinds (of {list(REFERENCE_KINDS)}), got {kinds!r}")
    for k in kinds:
        if k not in REFERENCE_KINDS:
            near = difflib.get_close_matches(str(k), REFERENCE_KINDS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"{where}: unknown reference kind {k!r}; allowed: {list(REFERENCE_KINDS)}{hint}")
    return tuple(k for k in REFERENCE_KINDS if k in kinds)


def offered_refs(prompt: list[dict] | str | None) -> tuple[str, ...]:
    """The reference kinds a planner prompt offers: its messages (a recorded step's planner_input, an RL state's prompt
    column) or the chat-template text rendered from them (what GRPO passes its reward functions). Only the system
    message offers; a rule is matched without its line end (Qwen3.5's template trims the system content)."""
    if isinstance(prompt, str):
        text = prompt
    else:
        system = prompt[0] if prompt and isinstance(prompt[0], dict) and prompt[0].get("role") == "system" else {}
        text = system.get("content") or ""
    return tuple(k for k in REFERENCE_KINDS if REFERENCE_RULES[k].strip() in text)


def resolve_refs(action: Action, ledger, kinds: tuple[str, ...]) -> Action:
    """`action` with every reference of the offered `kinds` resolved against `ledger` (the state the planner saw), as
    the runtime resolves it: need and focus references in one pass (resolve_text_refs), then a window reference
    (resolve_window_refs). The one resolver of the loop, the rewards, the judge and relabelling; a kind not offered
    stays literal text."""
    if not kinds:
        return action
    if "need" in kinds or "focus" in kinds:
        values = ledger.filled_values() if "need" in kinds else None
        action = resolve_text_refs(action, values, ledger.query_focuses() if "focus" in kinds else None)
    return resolve_window_refs(action, ledger.named_windows()) if "window" in kinds else action


def write_refs(action: Action, ledger, kinds: tuple[str, ...]) -> Action:
    """The inverse the offline teacher uses: the action with what the ledger holds written as references of the
    offered `kinds`: a time_range that is the call's need's window as {window:K}, the call's need's upstream values
    as {need:K}, then its focus and formula as {focus:K}; resolve_refs(write_refs(a, L, k), L, k) == a."""
    if "window" in kinds:
        action = write_window_refs(action, ledger.named_windows())
    i = action.arguments.get("need_index")
    if "need" in kinds and type(i) is int and 0 <= i < len(ledger.needs):
        filled = ledger.filled_values()
        action = write_value_refs(action, {d: filled[d] for d in ledger.needs[i].depends_on if d in filled})
    return write_focus_refs(action, ledger.query_focuses()) if "focus" in kinds else action


def focus_formula(focus: str | None) -> str | None:
    """The formula a computation need's query_focus names ("compute: to_num(v1) * to_num(v2)" -> "to_num(v1) *
    to_num(v2)"), None for any other focus: what the offline teacher's program prints and what "{focus:K}" stands for
    in code."""
    m = re.match(r"\s*compute:\s*(.+)", focus or "")
    return m.group(1).strip() if m else None


_MISSING = {  # what a reference to a need that is not in its table lacks, and what the error lists instead
    "need": ("which has no value", "needs with a value"),
    "focus in query": ("which has no query focus", "needs with one"),
    "focus in code": ("which names no formula", "needs with one"),
}


def resolve_text_refs(action: Action, values: dict[int, str] | None, focuses: dict[int, str] | None) -> Action:
    """The one resolver of the runtime (loop), the `valid` reward and the judge for references inside text
    arguments. values (the prompt offers value references; None: "{need:K}" is literal text): as
    resolve_value_refs. focuses (it offers focus references: Ledger.query_focuses(); None: literal): every
    "{focus:K}" in the query becomes need K's query_focus, in the code the formula of computation need K
    (focus_formula); a need with no focus (in code: no formula) is a malformed call. Both in one pass, so a value or
    focus that itself holds "{need:0}" or "{focus:1}" is not resolved again."""
    args = action.arguments
    out = dict(args)
    for key in VALUE_REF_KEYS:
        text = args.get(key)
        if type(text) is not str or "{" not in text:
            continue
        formulas = None
        if focuses is not None and key == "code":
            formulas = {k: f for k, f in ((k, focus_formula(v)) for k, v in focuses.items()) if f}
        tables = {"need": values, "focus": formulas if key == "code" else focuses}
        refs = [(m.group(1), int(m.group(2))) for m in TEXT_REF_RE.finditer(text)]
        refs = [(kind, k) for kind, k in refs if tables[kind] is not None]
        for kind, k in refs:
            table = tables[kind]
            if k not in table:
                have = ", ".join(str(i) for i in sorted(table)) or "none"
                what = _MISSING[kind if kind == "need" else f"focus in {key}"]
                raise ActionError(
                    "bad_arguments",
                    f"{action.name}.{key}: {{{kind}:{k}}} names need {k}, {what[0]} ({what[1]}: {have})",
                )
        if not refs:
            continue

        def sub(m: re.Match, key: str = key, tables: dict = tables) -> str:
            kind, k = m.group(1), int(m.group(2))
            if tables[kind] is None:
                return m.group(0)
            return _ref_text(key, tables[kind][k]) if kind == "need" else tables[kind][k]

        out[key] = TEXT_REF_RE.sub(sub, text)
    return action if out == args else Action(action.name, out)


def write_value_refs(action: Action, values: dict[int, str]) -> Action:
    """The inverse the offline teacher uses: each of `values` (need index -> value) found verbatim in the query (as
    its Python literal in the code) is written as "{need:K}", longest value first;
    resolve_value_refs(write_value_refs(a, v), v) == a."""
    out = dict(action.arguments)
    for key in VALUE_REF_KEYS:
        text = out.get(key)
        if type(text) is not str:
            continue
        for k, v in sorted(values.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lit = _ref_text(key, v)
            if v and "{need:" not in v and lit in text:
                text = text.replace(lit, f"{{need:{k}}}")
        out[key] = text
    return action if out == action.arguments else Action(action.name, out)


def write_focus_refs(action: Action, focuses: dict[int, str]) -> Action:
    """The inverse the offline teacher uses, after write_value_refs: the query_focus of the call's need (need_index),
    found verbatim in its query, is written "{focus:K}", and so is the formula of a computation need found in its
    code; resolve_text_refs(write_focus_refs(a, f), None, f) == a. Only the call's own need (a query names what that
    need lacks), and only text without braces, so it cannot overlap a "{need:K}" already written."""
    ni = action.arguments.get("need_index")
    focus = focuses.get(ni) if type(ni) is int else None
    out = dict(action.arguments)
    for key, part in (("query", focus), ("code", focus_formula(focus))):
        text = out.get(key)
        if type(text) is not str or not part or "{" in part or "}" in part or part not in text or "{focus:" in text:
            continue
        out[key] = text.replace(part, f"{{focus:{ni}}}")
    return action if out == action.arguments else Action(action.name, out)


def resolve_window_refs(action: Action, windows: dict[int, tuple[float, float]]) -> Action:
    """The action with a time_range of "{window:K}" replaced by need K's window as [start, end] (Ledger
    .named_windows()); the same action otherwise (any other string stays for the schema to refuse). A reference to a
    need that names no window is the planner's malformed call: ActionError bad_arguments, naming the needs with one."""
    tr = action.arguments.get("time_range")
    m = WINDOW_REF_RE.fullmatch(tr.strip()) if type(tr) is str else None
    if m is None:
        return action
    k = int(m.group(1))
    if k not in windows:
        have = ", ".join(str(i) for i in sorted(windows)) or "none"
        raise ActionError(
            "bad_arguments",
            f"{action.name}.time_range: {{window:{k}}} names need {k}, which names no time window "
            f"(needs with one: {have})",
        )
    return Action(action.name, {**action.arguments, "time_range": [windows[k][0], windows[k][1]]})


def write_window_refs(action: Action, windows: dict[int, tuple[float, float]]) -> Action:
    """The inverse the offline teacher uses: a time_range equal to a need's window is written "{window:K}", K the
    call's need_index when that need names it; resolve_window_refs(write_window_refs(a, w), w) == a (float ranges)."""
    tr, ni = action.arguments.get("time_range"), action.arguments.get("need_index")
    if type(tr) is not list or len(tr) != 2 or not all(_num(v) for v in tr):
        return action
    order = ([ni] if type(ni) is int else []) + sorted(windows)
    for k in order:
        if k in windows and (float(tr[0]), float(tr[1])) == windows[k]:
            return Action(action.name, {**action.arguments, "time_range": f"{{window:{k}}}"})
    return action


def validate_action(action: Action, tools: list[dict]) -> None:
    """Raise ActionError unless the tool exists in this state's tool set, the arguments satisfy its schema and
    `_check_beyond_schema` holds."""
    schemas = schema_index(tools)
    if action.name not in schemas:
        raise ActionError("unknown_tool", f"{action.name!r} is not one of {sorted(schemas)}")
    if not _surely_valid(schemas[action.name], action.arguments):
        try:
            validator = _validator(json.dumps(schemas[action.name], sort_keys=True))
            error = jsonschema.exceptions.best_match(validator.iter_errors(action.arguments))
            if error is not None:
                raise error
        except jsonschema.ValidationError as e:
            path = "/".join(str(p) for p in e.absolute_path) or "(root)"
            raise ActionError("bad_arguments", f"{action.name}.{path}: {e.message}") from None
    _check_beyond_schema(action)
