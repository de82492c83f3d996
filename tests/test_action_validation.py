"""validate_action's fast path (collect/actions.py `_surely_valid`): it may only ever say "valid" where jsonschema
says valid, it does say so for ordinary valid actions (so jsonschema is skipped), and anything it is unsure of still
gets jsonschema's verdict and message."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collect import actions
from collect.actions import Action, ActionError, _surely_valid, validate_action
from collect.roles import render
from collect.tools import ToolBox, ToolsConfig
from collect.world import load_world


def _all_tool_schemas() -> list[dict]:
    world = load_world(seed=0)
    seen, out = set(), []
    for task in world.tasks[:40]:
        r0 = task.to_context()
        for t in render.tools_for(r0, ToolBox(task, r0, ToolsConfig(), corpus=world.corpus).schemas()):
            f = t["function"]
            key = repr(f["parameters"])
            if key not in seen:
                seen.add(key)
                out.append(f["parameters"])
    return out


SCHEMAS = _all_tool_schemas()

json_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=True) | st.text(max_size=5)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
)


def _near(schema: dict) -> st.SearchStrategy:
    """Values shaped like the schema, with every kind of near miss (wrong types, bools, floats, missing or extra keys,
    short arrays, values outside the enum)."""
    t = schema.get("type")
    if t == "object":
        props = schema.get("properties", {})
        names = sorted(props) + ["extra_key"]
        return st.dictionaries(
            st.sampled_from(names), st.one_of(*[_near(props[n]) for n in sorted(props)], json_values), max_size=5
        )
    if t == "array":
        return st.lists(_near(schema.get("items", {})) | json_scalars, max_size=3)
    if t == "string":
        return st.sampled_from(schema.get("enum", ["q"]) + ["not_in_enum"]) | st.text(max_size=6) | json_scalars
    if t in ("integer", "number"):
        return st.integers(-3, 50) | st.floats(-3, 50) | st.booleans() | st.just(float("inf")) | json_scalars
    return json_values


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: ",".join(sorted(s.get("properties", {}))))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_path_never_accepts_what_jsonschema_rejects(schema, data):
    x = data.draw(_near(schema) | json_values)
    if _surely_valid(schema, x):
        assert jsonschema.validators.validator_for(schema)(schema).is_valid(x), x


def test_ordinary_valid_actions_skip_jsonschema(monkeypatch):
    world = load_world(seed=0)
    task = next(t for t in world.tasks if any(a.type == "video" for a in t.to_context().assets))
    r0 = task.to_context()
    tools = render.tools_for(r0, ToolBox(task, r0, ToolsConfig(), corpus=world.corpus).schemas())
    asset = next(a.id for a in r0.assets if a.type == "video")

    def boom(*a, **k):
        raise AssertionError("jsonschema was asked about a plainly valid action")

    monkeypatch.setattr(actions, "_validator", boom)
    validate_action(Action("web_search", {"query": "who built it", "need_index": 0}), tools)
    validate_action(Action("subtitle_grounding", {"asset_id": asset, "query": "q", "time_range": [1, 2.5]}), tools)
    validate_action(Action("finish", {"answer": "42"}), tools)


def test_invalid_actions_get_jsonschema_verdict_and_message():
    world = load_world(seed=0)
    task = next(t for t in world.tasks if any(a.type == "video" for a in t.to_context().assets))
    r0 = task.to_context()
    tools = render.tools_for(r0, ToolBox(task, r0, ToolsConfig(), corpus=world.corpus).schemas())
    cases = {
        ("web_search", '{"need_index": 0}'): "web_search.(root): 'query' is a required property",
        ("web_search", '{"query": "q", "need_index": true}'): "web_search.need_index: True is not of type 'integer'",
        ("web_search", '{"query": "q", "need_index": -1}'): "web_search.need_index: -1 is less than the minimum of 0",
        ("subtitle_grounding", '{"query": "q", "time_range": [1]}'): "subtitle_grounding.time_range: [1] is too short",
        # schema-valid, but a range that ends before it starts: the planner's error, not a failed tool attempt
        ("subtitle_grounding", '{"query": "q", "time_range": [170.0, 115]}'): (
            "subtitle_grounding.time_range: [170.0, 115] ends before it starts"
        ),
        ("web_search", '{"query": " \\n ", "need_index": 0}'): "web_search.query: must not be blank",
        ("code_executor", '{"code": ""}'): "code_executor.code: must not be blank",
    }
    for (name, args), message in cases.items():
        with pytest.raises(ActionError) as e:
            validate_action(Action(name, json.loads(args)), tools)
        assert e.value.kind == "bad_arguments" and e.value.detail == message, e.value.detail
    # a whole-number float is an integer to jsonschema: not certain for the fast path, accepted by jsonschema
    validate_action(Action("web_search", {"query": "q", "need_index": 1.0}), tools)
    # the same check on jsonschema's path (need_index 1.0 sends it there); an empty range is still a range
    with pytest.raises(ActionError, match="ends before it starts"):
        validate_action(Action("subtitle_grounding", {"query": "q", "time_range": [9, 2], "need_index": 1.0}), tools)
    validate_action(Action("subtitle_grounding", {"query": "q", "time_range": [5, 5]}), tools)
