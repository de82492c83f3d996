"""collect.summary.window_stats: does a planner pass the time window its need names ("between 35 s and 50 s") as the
perception call's time_range? Measured on the teacher's recorded runs and on a scripted planner run through the real
loop; the pooled eval figure is what pipeline.eval prints and reports."""

from __future__ import annotations

import json

import pytest

from collect.ledger import parse_time_range
from collect.loop import ToolFailure
from collect.summary import summarize, window_stats
from tests.fakes import FakeChatServer, FakeToolBox, text, tool_call
from tests.helpers.loop_script import NEEDS_WINDOW, R0_WINDOW, answer_critic, critic, fill, needs_reply, run


def frame(window):
    return tool_call("frame_confirm", {"asset_id": "v1", "query": "banner", "time_range": window, "need_index": 0})


@pytest.mark.parametrize(
    "text_, window",
    [("between 35 s and 50 s", (35.0, 50.0)), ("from 1.5s to 12s", (1.5, 12.0)), ("12 s-20 s", (12.0, 20.0))],
)
def test_a_window_is_read_from_the_needs_words(text_, window):
    assert parse_time_range(f"name of the ferry {text_} of video_1") == window
    assert parse_time_range("the founding year") is None


def test_the_teacher_always_passes_its_needs_window(recorded_correct_runs):
    stats = window_stats(recorded_correct_runs)
    assert stats["windowed_calls"] >= 4  # the anchor_compute tasks among the 24 name a window
    assert stats["window_matches"] == stats["windowed_calls"] and stats["window_match_rate"] == 1.0
    assert stats["tasks_with_wrong_window"] == 0


def test_a_memorised_window_is_counted_against_the_planner():
    with FakeChatServer() as srv:
        srv.script("need_parser", needs_reply(NEEDS_WINDOW))
        web = tool_call("web_search", {"query": "Acme founded", "need_index": 1})
        srv.script("planner", frame([15.0, 30.0]), frame([35, 50]), web, tool_call("finish", {"answer": "1999"}))
        srv.script("critic", critic(), critic(updates=[fill(0, "Acme")]), critic("SUFFICIENT", [fill(1, "1999")]))
        srv.script("finalizer", text("1999"))
        srv.script("answer_critic", answer_critic(True))
        rec = run(srv, r0=R0_WINDOW, toolbox=FakeToolBox(ToolFailure, fallback=lambda n, a: "[40.0-44.0s] ACME"))
    assert rec["outcome"] == "accepted"
    # two perception calls on need 0 (the memorised 15-30 s, then 35-50 s given as ints); the web call is not one
    want = {"windowed_calls": 2, "window_matches": 1, "window_match_rate": 0.5, "tasks_with_wrong_window": 1}
    assert window_stats([rec]) == want
    assert summarize([rec])["time_windows"] == want


def test_a_malformed_time_range_is_a_miss_not_a_crash(recorded_correct_runs):
    rec = next(
        r
        for r in recorded_correct_runs
        if any((s.get("action") or {}).get("arguments", {}).get("time_range") for s in r["steps"])
    )
    rec = json.loads(json.dumps(rec))
    s = next(s for s in rec["steps"] if (s.get("action") or {}).get("arguments", {}).get("time_range"))
    s["action"]["arguments"]["time_range"] = ["soon", None]
    stats = window_stats([rec])
    assert stats["window_matches"] == stats["windowed_calls"] - 1 and stats["tasks_with_wrong_window"] == 1
