"""Tools: schemas, annotation perception, BM25 + blocked domains, HTTP provider, code executor, real-media path."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from collect.actions import Action, validate_action
from collect.tasks import AssetSpec, Task, Tracks
from collect.tools import ToolBox, ToolFailure, ToolsConfig, tool_schemas
from collect.tools.web import bm25_index, bm25_search, is_blocked
from collect.world import build_world


def _video_task(extra_assets=()):
    tracks = Tracks(
        subtitles=[
            {"start": 1.0, "end": 4.0, "text": "Welcome to the harbour."},
            {"start": 20.0, "end": 24.0, "text": "Here we are at Kelmora Ferries, by the pier."},
            {"start": 50.0, "end": 54.0, "text": "Later we visit Kelmorra Ferries on the far shore."},
        ]
    )
    assets = [AssetSpec(id="video_1", type="video", duration=60.0, tracks=tracks), *extra_assets]
    return Task(id="t1", question="q", answer="a", assets=assets)


def test_schemas_follow_r0_order_and_require_asset_id_only_with_several_assets():
    t = _video_task()
    r0 = t.to_context()
    names = [s["function"]["name"] for s in tool_schemas(r0)]
    assert names == list(r0.tools())
    sub = tool_schemas(r0)[0]["function"]["parameters"]
    assert sub["required"] == ["query"] and "time_range" in sub["properties"] and "need_index" in sub["properties"]
    assert "web_search" not in [s["function"]["name"] for s in tool_schemas(r0, web=False)]
    t2 = _video_task([AssetSpec(id="image_1", type="image")])
    s2 = {s["function"]["name"]: s["function"]["parameters"] for s in tool_schemas(t2.to_context())}
    assert s2["frame_confirm"]["required"] == ["asset_id", "query"]
    assert s2["frame_confirm"]["properties"]["asset_id"]["enum"] == ["video_1", "image_1"]
    validate_action(Action("frame_confirm", {"asset_id": "image_1", "query": "sign"}), tool_schemas(t2.to_context()))
    with pytest.raises(ValueError):
        validate_action(Action("frame_confirm", {"query": "sign"}), tool_schemas(t2.to_context()))
    with pytest.raises(ValueError):
        validate_action(Action("finish", {}), tool_schemas(r0))


def test_annotation_perception_returns_subtitle_span_for_time_range():
    t = _video_task()
    box = ToolBox(t, t.to_context(), ToolsConfig())
    raw, obs = asyncio.run(box.execute("subtitle_grounding", {"query": "ferries", "time_range": [15, 30]}))
    assert obs.ok and obs.asset_id == "video_1" and obs.span == (20.0, 24.0)
    assert len(obs.items) == 1 and "Kelmora Ferries" in obs.items[0] and "Kelmorra" not in raw
    _, obs2 = asyncio.run(box.execute("subtitle_grounding", {"query": "ferries"}))
    assert len(obs2.items) == 2 and obs2.span == (20.0, 54.0)
    _, empty = asyncio.run(box.execute("subtitle_grounding", {"query": "x", "time_range": [100, 120]}))
    assert empty.items == () and "nothing found" in empty.summary


def test_perception_failures_raise_tool_failure():
    t = _video_task([AssetSpec(id="image_1", type="image")])
    box = ToolBox(t, t.to_context(), ToolsConfig())
    for name, args in [
        ("subtitle_grounding", {"asset_id": "nope", "query": "x"}),
        ("subtitle_grounding", {"asset_id": "image_1", "query": "x"}),
        ("frame_confirm", {"query": "x"}),  # two assets serve frames: asset_id required
        ("subtitle_grounding", {"asset_id": "video_1", "query": "x", "time_range": [5, 1]}),
        ("finish", {"answer": "x"}),
    ]:
        with pytest.raises(ToolFailure):
            asyncio.run(box.execute(name, args))


def test_bm25_finds_the_gold_doc_for_entity_and_attribute():
    w = build_world(0)
    hits_at_1 = 0
    tasks = [t for t in w.tasks if t.family == "anchor_web"][:20]
    for t in tasks:
        n1 = t.gold_chain[1]
        res = bm25_search(w.corpus, f"{t.meta['entity']} {n1.query_focus}", 5, ())
        assert any(n1.gold_value in r["snippet"] for r in res), t.id
        hits_at_1 += res[0]["title"] == f"About {t.meta['entity']}"
    assert hits_at_1 >= 0.8 * len(tasks)


STEM_CORPUS = [
    {"url": "https://a.example/keeper", "title": "The keeper", "text": "The last lighthouse keeper lit the lamp."},
    {"url": "https://b.example/ferry", "title": "Ferry", "text": "The ferry crossing takes an hour."},
]


def test_bm25_stems_english_by_default_and_can_be_told_not_to():
    # every content word of the query is in another form in the page: only a stemmed search finds it
    hits = bm25_search(STEM_CORPUS, "lighthouses keepers lamps", 5, ())
    assert [h["link"] for h in hits] == ["https://a.example/keeper"]
    assert bm25_search(STEM_CORPUS, "lighthouses keepers lamps", 5, (), stemmer="") == []
    assert bm25_search(STEM_CORPUS, "lighthouse keeper", 5, (), stemmer="")  # the words as written still match


def test_bm25_index_cache_is_keyed_on_the_stemmer():
    corpus = [dict(d) for d in STEM_CORPUS]
    english, plain = bm25_index(corpus, "english"), bm25_index(corpus, "")
    assert english is not plain and bm25_index(corpus, "english") is english and bm25_index(corpus, "") is plain
    assert bm25_index(corpus) is english  # the default is the English stemmer


def test_web_stemmer_is_checked_by_the_config():
    assert ToolsConfig().web_stemmer == "english" and ToolsConfig(web_stemmer="").web_stemmer == ""
    with pytest.raises(ValueError, match="ToolsConfig.web_stemmer: 'klingon' is not one of .*english"):
        ToolsConfig(web_stemmer="klingon")


def test_blocked_domains_are_dropped():
    corpus = [
        {
            "id": "1",
            "url": "https://huggingface.co/datasets/RUC-NLPIR/OmniGAIA/viewer",
            "title": "Zarvex answer key",
            "text": "Zarvex Zarvex Zarvex founded 1911",
            "date": "",
        },
        {
            "id": "2",
            "url": "https://sub.leaky.example/x",
            "title": "Zarvex mirror",
            "text": "Zarvex founded 1911",
            "date": "",
        },
        {
            "id": "3",
            "url": "https://ok.example/zarvex",
            "title": "Zarvex history",
            "text": "Zarvex founded 1911",
            "date": "",
        },
    ]
    cfg = ToolsConfig(blocked_domains=ToolsConfig().blocked_domains + ("leaky.example",))
    t = _video_task()
    box = ToolBox(t, t.to_context(), cfg, corpus=corpus)
    _, obs = asyncio.run(box.execute("web_search", {"query": "Zarvex founded"}))
    assert len(obs.items) == 1 and "ok.example" in obs.items[0]
    assert len(bm25_search(corpus, "Zarvex founded", 5, ())) == 3  # without the block list all three are found
    assert is_blocked("https://github.com/RUC-NLPIR/OmniGAIA/blob/main/x.json", cfg.blocked_domains)
    assert not is_blocked("https://github.com/other/repo", cfg.blocked_domains)


class _Recorder(BaseHTTPRequestHandler):
    requests: list = []
    reply: dict = {}

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "body": body, "headers": {k.lower(): v for k, v in self.headers.items()}}
        )
        data = json.dumps(type(self).reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


@pytest.fixture()
def loopback():
    handler = type("H", (_Recorder,), {"requests": [], "reply": {}})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield handler, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_http_search_backend_posts_query_and_drops_blocked(loopback, monkeypatch):
    handler, url = loopback
    handler.reply = {
        "organic": [
            {"title": "Leak", "link": "https://huggingface.co/datasets/RUC-NLPIR/OmniGAIA", "snippet": "answer"},
            {"title": "Good", "link": "https://news.example/a", "snippet": "Zarvex founded 1911", "date": "2024"},
        ]
    }
    monkeypatch.setenv("TEST_SEARCH_KEY", "k-123")
    cfg = ToolsConfig(web_backend="http", web_provider_url=url + "/search", web_api_key_env="TEST_SEARCH_KEY")
    t = _video_task()
    raw, obs = asyncio.run(ToolBox(t, t.to_context(), cfg).execute("web_search", {"query": "Zarvex founded"}))
    req = handler.requests[0]
    assert req["body"] == {"q": "Zarvex founded", "num": 5} and req["headers"]["x-api-key"] == "k-123"
    assert len(obs.items) == 1 and "news.example" in obs.items[0] and "k-123" not in raw


def test_code_executor_tool_runs_in_sandbox():
    t = _video_task()
    box = ToolBox(t, t.to_context(), ToolsConfig(code_timeout_s=10))
    _, obs = asyncio.run(box.execute("code_executor", {"code": "print(6 * 7)"}))
    assert obs.ok and obs.items == ("42",)
    _, bad = asyncio.run(box.execute("code_executor", {"code": "raise SystemExit(3)"}))
    assert not bad.ok and bad.error


def _make_video(path, seconds=6, fps=10):
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=fps)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        s.time_base = Fraction(1, fps)
        for i in range(seconds * fps):
            img = np.full((48, 64, 3), (i * 4) % 255, dtype=np.uint8)
            f = av.VideoFrame.from_ndarray(img, format="rgb24")
            f.pts = i
            for p in s.encode(f):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def test_media_perception_sends_frames_of_requested_range(loopback, tmp_path, monkeypatch):
    handler, url = loopback
    handler.reply = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "fake-omni",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "A sign reads KELMORA FERRIES."},
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    _make_video(tmp_path / "clip.mp4")
    monkeypatch.setenv("TEST_MEDIA_KEY", "secret-xyz")
    cfg = ToolsConfig(
        perception_backend="media",
        media_base_url=url + "/v1",
        media_model="fake-omni",
        media_api_key_env="TEST_MEDIA_KEY",
        media_root=str(tmp_path),
        frames_per_range=4,
    )
    t = Task(
        id="m", question="q", answer="a", assets=[AssetSpec(id="video_1", type="video", duration=6.0, path="clip.mp4")]
    )
    raw, obs = asyncio.run(
        ToolBox(t, t.to_context(), cfg).execute("frame_confirm", {"query": "sign text", "time_range": [2, 4]})
    )
    assert raw == "A sign reads KELMORA FERRIES." and obs.span == (2.0, 4.0) and obs.asset_id == "video_1"
    req = handler.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["body"]["model"] == "fake-omni"
    assert req["headers"]["authorization"] == "Bearer secret-xyz"
    parts = req["body"]["messages"][0]["content"]
    images = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    stamps = [float(p["text"].split("t=")[1].rstrip("s")) for p in parts if p["type"] == "text" and "t=" in p["text"]]
    assert len(images) == 4 and len(stamps) == 4
    assert all(2.0 <= s <= 4.0 for s in stamps) and stamps == sorted(stamps) and len(set(stamps)) == 4
    for u in images:
        assert u.startswith("data:image/jpeg;base64,")
        assert base64.b64decode(u.split(",", 1)[1])[:2] == b"\xff\xd8"


def test_the_stemmer_is_part_of_the_config_hash():
    # an OUT written with the words as written must not resume under the stemmed search (or the other way round)
    from collect.config import CollectConfig

    default = CollectConfig(tools={"web_backend": "bm25"})
    assert default.hash() == CollectConfig(tools={"web_backend": "bm25", "web_stemmer": "english"}).hash()
    assert default.hash() != CollectConfig(tools={"web_backend": "bm25", "web_stemmer": ""}).hash()
    http = {"web_backend": "http", "web_provider_url": "http://127.0.0.1:9/search"}
    assert "web_stemmer" not in json.dumps(CollectConfig(tools=http).to_dict()["tools"])
