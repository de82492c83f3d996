"""Strict JSON on every write, one decoder for untrusted text, known secrets out of everything written (issue 52,
classes 4, 5 and 7): collect/jsonio.py, and the write paths that go through it.

Strict means what RFC 8259 readers accept (jq, JavaScript's JSON.parse, serde): Python's json writes and reads the
bare tokens NaN, Infinity and -Infinity, which they reject."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from collect import jsonio
from tests.fakes import FakeChatServer, tool_call

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("collect", "rewards", "serve", "sft", "rl", "bench")


def strict(text: str | bytes):
    def refuse(token):
        raise ValueError(f"bare {token} token")

    return json.loads(text, parse_constant=refuse)


# --------------------------------------------------------------------------------------------------------------------
# the one decoder
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,needle",
    [
        ('{"a": NaN}', "NaN is not a JSON number"),
        ("[Infinity]", "Infinity is not a JSON number"),
        ("[-Infinity]", "-Infinity is not a JSON number"),
        ("[1e400]", "overflows a float"),
        ("[" + "9" * 5000 + "]", "int-string limit"),  # ValueError from int()
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),  # RecursionError
        (b"\xff\xfe[1]", ""),  # not UTF-8: UnicodeDecodeError
        (5, "must be str"),  # not text at all: TypeError
        ('{"a": 1', "Expecting"),
    ],
)
def test_every_failure_mode_of_the_decoder_is_one_bad_json(text, needle):
    with pytest.raises(jsonio.BadJSON) as e:
        jsonio.loads(text)
    assert needle in str(e.value)


def test_strict_json_still_reads_ordinary_numbers():
    assert jsonio.loads('{"a": [1, -2.5, 1e308, 0.0, ' + "9" * 4000 + "]}")["a"][:4] == [1, -2.5, 1e308, 0.0]


# --------------------------------------------------------------------------------------------------------------------
# the encoders
# --------------------------------------------------------------------------------------------------------------------


def test_dumps_refuses_nan_naming_its_path_or_writes_it_as_text():
    obj = {"steps": [{"time_range": [0.0, math.inf]}], "loss": [math.nan, -math.inf]}
    with pytest.raises(jsonio.NotJSON) as e:
        jsonio.dumps(obj, what="record of task t")
    assert str(e.value).startswith("record of task t: steps[0].time_range[1] is inf")
    text = jsonio.dumps(obj, nonfinite="string")
    assert strict(text) == {"steps": [{"time_range": [0.0, "Infinity"]}], "loss": ["NaN", "-Infinity"]}


def test_write_json_is_strict_and_atomic(tmp_path):
    p = tmp_path / "stats.json"
    jsonio.write_json(p, {"loss": math.nan, "n": 3})
    assert strict(p.read_text()) == {"loss": "NaN", "n": 3} and not (tmp_path / "stats.json.tmp").exists()
    with pytest.raises(jsonio.NotJSON, match=r"stats.json: loss is nan"):
        jsonio.write_json(p, {"loss": math.nan}, nonfinite="refuse")
    assert strict(p.read_text()) == {"loss": "NaN", "n": 3}  # the old file stands


def test_dumps_removes_registered_secret_values_everywhere_and_nothing_else(monkeypatch):
    secret = 'plain"value\\4242-lantern'  # escaped in JSON text: a quote and a backslash
    monkeypatch.setenv("JSONIO_TEST_KEY", secret)
    monkeypatch.setenv("SOME_OTHER_TOKEN", "not-registered-value-99")
    jsonio.register_key_env("JSONIO_TEST_KEY")
    obj = {"text": f"the key is {secret}!", secret: [f"x{secret}"], "shaped": "sk-learn is a library"}
    out = strict(jsonio.dumps(obj, ensure_ascii=False))
    assert out == {
        "text": "the key is [REDACTED]!",
        "[REDACTED]": ["x[REDACTED]"],
        "shaped": "sk-learn is a library",  # model text that looks like a key is data: only known values go
    }
    assert "not-registered-value-99" in jsonio.dumps({"t": "not-registered-value-99"})


# --------------------------------------------------------------------------------------------------------------------
# every write path goes through them
# --------------------------------------------------------------------------------------------------------------------


def _json_writes_outside_jsonio() -> list[str]:
    """`json.dump(...)` anywhere, or `json.dumps(...)` inside the arguments of a `.write`, `.write_text`,
    `.writelines` or `print` call, in the project's code (collect/jsonio.py excepted)."""
    found = []
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if p == ROOT / "collect" / "jsonio.py":
                continue
            tree = ast.parse(p.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Attribute) and f.attr == "dump" and getattr(f.value, "id", None) == "json":
                    found.append(f"{p.relative_to(ROOT)}:{node.lineno}: json.dump")
                    continue
                writer = (isinstance(f, ast.Attribute) and f.attr in ("write", "write_text", "writelines")) or (
                    isinstance(f, ast.Name) and f.id == "print"
                )
                if not writer:
                    continue
                for inner in ast.walk(ast.Module(body=[ast.Expr(a) for a in node.args], type_ignores=[])):
                    g = getattr(inner, "func", None)
                    if isinstance(g, ast.Attribute) and g.attr == "dumps" and getattr(g.value, "id", None) == "json":
                        found.append(f"{p.relative_to(ROOT)}:{node.lineno}: json.dumps written")
    return found


def test_every_json_file_write_goes_through_collect_jsonio():
    """Before: 29 writes (summaries, stats, rows, the eval and training summaries) called json.dumps/json.dump
    directly, so a NaN loss or figure was written as a bare NaN token and a key in a value verbatim."""
    assert _json_writes_outside_jsonio() == []


def test_summary_json_holds_strict_json_when_a_figure_is_not_finite(tmp_path, monkeypatch):
    """The engine's summary.json (collect/run.py) with a figure that came out NaN (a division by zero in a future
    metric): written as the string "NaN", never the bare token. Before: a bare NaN."""
    import collect.run as run_mod
    from collect.config import load_config
    from tests.test_reliability import write_config

    real = run_mod.summarize
    monkeypatch.setattr(run_mod, "summarize", lambda recs, **kw: {**real(recs, **kw), "ratio": math.nan})
    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}))
        run_mod.run_collection(load_config(write_config(tmp_path / "c.yaml", srv.base_url, limit=1)), tmp_path / "o")
    assert strict((tmp_path / "o" / "summary.json").read_text())["ratio"] == "NaN"
    strict((tmp_path / "o" / "run_config.json").read_text())


def test_a_record_that_still_holds_a_nan_is_not_written_and_the_task_is_errored_naming_the_field(
    tmp_path, monkeypatch
):
    """A NaN that got past every boundary (a bug) reaches the engine's writer: the task is listed in errored_tasks
    with the field's path and retried by the next run; no line is written for it. Before: a bare NaN was written."""
    import collect.run as run_mod
    from collect.config import load_config
    from tests.test_reliability import write_config

    real = run_mod.run_task

    async def leaky(*a, **kw):
        rec = await real(*a, **kw)
        rec["steps"][0]["latency_s"] = math.nan
        return rec

    monkeypatch.setattr(run_mod, "run_task", leaky)
    with FakeChatServer() as srv:
        srv.default("planner", tool_call("finish", {"answer": "unknown"}))
        cfg = load_config(write_config(tmp_path / "c.yaml", srv.base_url, limit=1))
        summary = run_mod.run_collection(cfg, tmp_path / "o")
    (tid, err), *_ = summary["errored_tasks"].items()
    assert f"NotJSON: trajectory record of task {tid}: steps[0].latency_s is nan" in err
    traj = tmp_path / "o" / "trajectories.jsonl"
    assert not traj.exists() or traj.read_text() == ""
